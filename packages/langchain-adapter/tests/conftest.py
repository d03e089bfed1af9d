"""Real processes for the adapter tests: a scripted OpenAI-compatible upstream, `agl serve`, `agl worker`."""

from agl.testing.fixtures import *  # noqa: F403
