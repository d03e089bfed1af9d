"""Real processes for the adapter tests: a scripted OpenAI-compatible upstream, `agl serve` and `agl worker`."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from agents.tracing import TracingProcessor, get_trace_provider, set_trace_processors

import agl_openai_agents
from agl.testing.fixtures import *  # noqa: F403

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "triage_handoff.py"


def load_example() -> ModuleType:
    """The example app as a module (the way `agl worker` loads it from its path)."""
    if "triage_handoff" not in sys.modules:
        spec = importlib.util.spec_from_file_location("triage_handoff", EXAMPLE)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["triage_handoff"] = module
        spec.loader.exec_module(module)
    return sys.modules["triage_handoff"]


def trace_processors() -> list[TracingProcessor]:
    return list(get_trace_provider()._multi_processor._processors)  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def pristine_tracing() -> Iterator[None]:
    """Each test starts and ends uninstrumented, with the SDK's processors as they were."""
    agl_openai_agents.uninstrument()
    before = trace_processors()
    yield
    agl_openai_agents.uninstrument()
    set_trace_processors(before)
