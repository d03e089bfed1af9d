from agl.testing.fixtures import *  # noqa: F403  (agl_upstream, agl_server, agl_client, agl_workers)
