"""Real processes for the adapter tests (a scripted OpenAI-compatible upstream, `agl serve`, `agl worker`), and
a clean SDK trace pipeline for every test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from agents.tracing import processors as sdk_processors
from agents.tracing import set_trace_processors

import agl_openai_agents
from openai_agents_support import Collecting, trace_processors


@pytest.fixture(autouse=True)
def openai_export(monkeypatch: pytest.MonkeyPatch) -> Iterator[Collecting]:
    """Each test starts uninstrumented with one trace processor: in place of the SDK's default one, which would
    send traces to OpenAI, one that only keeps them (it is what `default_processor()` returns meanwhile)."""
    agl_openai_agents.uninstrument()
    before = trace_processors()
    exporter = Collecting()
    monkeypatch.setattr(sdk_processors, "_global_processor", exporter)
    set_trace_processors([exporter])
    yield exporter
    agl_openai_agents.uninstrument()
    set_trace_processors(before)
