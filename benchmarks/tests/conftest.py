"""agl_upstream, agl_server, agl_client and agl_workers come from agl-core's pytest plugin (agl.testing.fixtures)."""
