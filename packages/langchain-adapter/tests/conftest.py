"""Real processes for the adapter tests (a scripted OpenAI-compatible upstream, `agl serve`, `agl worker`) come
from agl-core's pytest plugin (agl.testing.fixtures): agl_upstream, agl_server, agl_client, agl_workers."""
