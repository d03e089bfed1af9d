"""`instrument()` / `AglListener()`: nothing at import, once however often it is called, fully removable, and
invisible outside a rollout."""

from __future__ import annotations

import subprocess
import sys
from types import ModuleType

from crewai import Agent
from crewai.events.event_bus import crewai_event_bus
from crewai.events.types.tool_usage_events import ToolUsageErrorEvent, ToolUsageFinishedEvent
from crewai_helpers import run_one

import agl
import agl_crewai
from agl.client import Client
from agl.common.processes import ServerProcess
from agl_crewai import AglListener, agent_scopes

QUESTION = {"question": "What is 12 + 30?", "answer": 42}
WRAPPED = ("execute_task", "aexecute_task", "kickoff", "kickoff_async")


def our_handlers(event_type: type) -> list[object]:
    handlers = crewai_event_bus._sync_handlers.get(event_type, frozenset())
    return [h for h in handlers if getattr(h, "__module__", "").startswith("agl_crewai")]


def wrapped_methods() -> list[str]:
    return [name for name in WRAPPED if hasattr(getattr(Agent, name), "__wrapped__")]


def test_importing_the_package_changes_nothing() -> None:
    check = (
        "import agl_crewai\n"
        "from crewai import Agent\n"
        "from crewai.events.event_bus import crewai_event_bus as bus\n"
        f"assert not any(hasattr(getattr(Agent, n), '__wrapped__') for n in {WRAPPED!r})\n"
        "assert not [h for hs in bus._sync_handlers.values() for h in hs if 'agl_crewai' in h.__module__]\n"
        "assert not agl_crewai.is_instrumented()\n"
    )
    subprocess.run([sys.executable, "-c", check], check=True, timeout=120)


def test_instrumenting_twice_is_instrumenting_once(
    example: ModuleType, agl_server: ServerProcess, agl_client: Client
) -> None:
    listener = agl_crewai.instrument()
    assert agl_crewai.instrument() is listener and AglListener() is listener
    assert len(our_handlers(ToolUsageFinishedEvent)) == len(our_handlers(ToolUsageErrorEvent)) == 1
    assert wrapped_methods() == list(WRAPPED)
    assert not hasattr(Agent.execute_task.__wrapped__, "__wrapped__")  # one layer, not two
    detail = run_one(example.research_crew, agl_server, agl_client, QUESTION)
    assert sorted(s.name for s in detail.spans) == ["agent:Researcher", "agent:Writer", "tool:calculator"]


def test_uninstrument_removes_everything(example: ModuleType, agl_server: ServerProcess, agl_client: Client) -> None:
    listener = agl_crewai.instrument()
    try:
        listener.remove()
        agl_crewai.uninstrument()  # a second removal is a no-op
        assert not agl_crewai.is_instrumented() and not listener.listening
        assert wrapped_methods() == [] and not agent_scopes.installed()
        assert our_handlers(ToolUsageFinishedEvent) == []
        detail = run_one(example.research_crew, agl_server, agl_client, QUESTION)
        # the crew still works; its calls are stored but flagged, since nobody named their agent
        assert [c.attribution.value for c in detail.llm_calls] == ["unattributed"] * 3
        assert detail.spans == []
        assert AglListener() is not listener  # it can be installed again afresh
    finally:
        agl_crewai.instrument()


def test_outside_a_rollout_the_app_runs_unchanged(example: ModuleType, agl_upstream: str) -> None:
    agl_crewai.instrument()
    assert agl.current_rollout() is None
    direct = agl.LLM(base_url=agl_upstream, model="scripted")  # the model itself, no agl proxy in between
    assert example.research_crew(QUESTION, direct) == 1.0
    assert agl.current_agent() is None  # no scope leaked out of the agents' work


def test_crewais_approximate_token_count_warning_is_silenced_while_instrumented(caplog: object) -> None:
    """On any OpenAI-compatible server (agl's proxy) CrewAI estimates input tokens and warns at each estimate;
    agl records the exact ids of every call, so the adapter drops that one warning, and only while it is on."""
    import logging

    import pytest
    from crewai import LLM

    assert isinstance(caplog, pytest.LogCaptureFixture)
    llm = LLM(model="openai/agl-policy", base_url="http://127.0.0.1:8765/v1", api_key="agl")
    agl_crewai.instrument()
    try:
        with caplog.at_level(logging.WARNING):
            assert llm.get_input_tokens_count("What is 12 + 30?") > 0
        assert "approximate input token count" not in caplog.text
    finally:
        agl_crewai.uninstrument()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        llm.get_input_tokens_count("What is 12 + 30?")
    assert "approximate input token count" in caplog.text  # CrewAI's own, back once agl is off
