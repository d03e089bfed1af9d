"""All five adapters (and core's HTTP hook) have one entry-point shape, on one base: `instrument()`,
`uninstrument()`, `is_instrumented()`, and an `agl.capture.instrumentation.Instrumentor` subclass that runs them."""

from __future__ import annotations

import importlib

import pytest

from agl.capture.instrumentation import Instrumentor
from agl.capture.tracing.http_inject import HttpInstrumentor

ADAPTERS = {
    "agl_langchain": "LangChainInstrumentor",
    "agl_autogen": "AutoGenInstrumentor",
    "agl_openai_agents": "OpenAIAgentsInstrumentor",
    "agl_crewai": "CrewAIInstrumentor",
    "agl_otel": "OTelInstrumentor",
}


@pytest.mark.parametrize("package", sorted(ADAPTERS))
def test_each_adapter_has_the_same_entry_points(package: str) -> None:
    module = importlib.import_module(package)
    instrumentor = getattr(module, ADAPTERS[package])
    assert issubclass(instrumentor, Instrumentor) and instrumentor() is instrumentor()
    assert {"instrument", "uninstrument", "is_instrumented", ADAPTERS[package]} <= set(module.__all__)
    was = module.is_instrumented()
    try:
        module.instrument()
        module.instrument()
        assert module.is_instrumented() and instrumentor().is_instrumented()
        module.uninstrument()
        module.uninstrument()
        assert not module.is_instrumented() and instrumentor().patches == ()
    finally:
        if was:
            module.instrument()


def test_core_http_hook_is_on_the_same_base() -> None:
    assert issubclass(HttpInstrumentor, Instrumentor)
