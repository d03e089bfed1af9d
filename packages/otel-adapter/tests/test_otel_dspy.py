"""DSPy through OpenInference spans and agl_otel: the planner's and the solver's calls (two ReAct agents, one the
other's tool) each under their own agent, the tool spans with their arguments and ok/error, through real
`agl serve` and `agl worker` processes against the scripted backend."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agl.client import Client
from agl.common import attributes as attr
from agl.common.processes import ServerProcess
from agl.learn.selection import AgentSelection
from agl.learn.transitions import build_episodes
from otel_support import agents_of_calls, assert_exact_ids, run_example, tool_spans

pytest.importorskip("dspy", reason="DSPy is not installed: pip install dspy")
pytest.importorskip(
    "openinference.instrumentation.dspy",
    reason="OpenInference's DSPy instrumentation is not installed: pip install openinference-instrumentation-dspy",
)


def _instructions_of(call: Any) -> str | None:
    """The agent whose instructions the request's system message carries (`You are <name>.`; DSPy puts them
    after its description of the signature's fields)."""
    system = str(call.request["messages"][0]["content"])
    named = [n for n in ("planner", "solver") if f"You are {n}." in system]
    return named[0] if len(named) == 1 else None


def _tools(detail: Any) -> list[tuple[str, str, str | None, str | None, Any]]:
    """(tool, status, error, agent, keyword arguments) of each tool span, in start order."""
    return [
        (
            str(s.attributes[attr.TOOL_NAME]),
            s.status.value,
            s.status_message,
            s.agent_name,
            json.loads(str(s.attributes[attr.TOOL_ARGUMENTS]))["kwargs"],
        )
        for s in tool_spans(detail)
    ]


def test_a_react_agent_as_a_tool_and_a_failing_tool_through_a_real_worker(
    agl_server: ServerProcess, agl_client: Client, agl_workers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download of LiteLLM's price list
    tasks = [{"question": "What is 12 * 7?", "answer": 84}, {"question": "What is 9 / 0?", "answer": 0}]
    # ReActV2 hands a tool's exception back to the model as an observation: both rollouts succeed
    details = run_example(
        "dspy_react_delegation",
        agl_server,
        agl_client,
        agl_workers,
        tasks,
        statuses=["succeeded", "succeeded"],
        timeout=180,
    )
    for detail in details:
        # planner asks the solver; the solver calls its calculator, then submits; the planner submits
        assert agents_of_calls(detail) == ["planner", "solver", "solver", "planner"]
        assert [_instructions_of(c) for c in detail.llm_calls] == agents_of_calls(detail)
        assert all(c.trainable and c.prompt_ids and c.response_ids for c in detail.llm_calls)
        assert_exact_ids(detail)
        assert {s.name for s in detail.spans if s.attributes.get(attr.SPAN_KIND) == "agent"} == {
            "agent:planner",
            "agent:solver",
        }

    first, second = (_tools(d) for d in details)
    assert [(name, status, agent) for name, status, _, agent, _ in first] == [
        ("ask_solver", "ok", "planner"),
        ("calculator", "ok", "solver"),
        ("submit", "ok", "solver"),
        ("submit", "ok", "planner"),
    ]
    assert first[1][4] == {"expression": "12*7"}
    assert "What is 12 * 7?" in first[0][4]["question"]
    calculator = next(t for t in second if t[0] == "calculator")
    assert calculator[1:5] == ("error", "ZeroDivisionError: division by zero", "solver", {"expression": "9/0"})

    episodes, stats = build_episodes(details, AgentSelection.parse("solver"))
    trained = [t.agent_name for e in episodes for t in e.transitions]
    assert trained and set(trained) == {"solver"}
    assert stats.dropped_calls["agent not selected"] == sum(
        c.agent_name == "planner" for d in details for c in d.llm_calls
    )
