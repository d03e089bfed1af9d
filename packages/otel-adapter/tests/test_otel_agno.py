"""Agno through OpenInference spans and agl_otel: the planner team's and its solver member's calls each under their
own agent (the request each carries is that agent's), the tool spans with their arguments and ok/error, through
real `agl serve` and `agl worker` processes against the scripted backend."""

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

pytest.importorskip("agno", reason="Agno is not installed: pip install agno openai")
pytest.importorskip(
    "openinference.instrumentation.agno",
    reason="OpenInference's Agno instrumentation is not installed: pip install openinference-instrumentation-agno",
)


def _instructions_of(call: Any) -> str | None:
    """The agent whose instructions the request's system message carries (`You are <name>.`)."""
    system = str(call.request["messages"][0]["content"])
    named = [n for n in ("planner", "solver") if f"You are {n}." in system]
    return named[0] if len(named) == 1 else None


def _tools(detail: Any) -> list[tuple[str, str, str | None, str | None, Any]]:
    """(tool, status, error, agent, arguments) of each tool span, in start order."""
    return [
        (
            str(s.attributes[attr.TOOL_NAME]),
            s.status.value,
            s.status_message,
            s.agent_name,
            json.loads(str(s.attributes[attr.TOOL_ARGUMENTS])),
        )
        for s in tool_spans(detail)
    ]


def test_a_team_member_and_a_failing_tool_through_a_real_worker(
    agl_server: ServerProcess, agl_client: Client, agl_workers: Any
) -> None:
    tasks = [{"question": "What is 12 * 7?", "answer": 84}, {"question": "What is 9 / 0?", "answer": 0}]
    # Agno hands a tool's exception back to the model as the tool's result: both rollouts succeed
    details = run_example(
        "agno_team", agl_server, agl_client, agl_workers, tasks, statuses=["succeeded", "succeeded"], timeout=180
    )
    for detail in details:
        # the planner delegates; the solver calls its calculator, then answers; the planner answers
        assert agents_of_calls(detail) == ["planner", "solver", "solver", "planner"]
        assert [_instructions_of(c) for c in detail.llm_calls] == agents_of_calls(detail)
        assert all(c.trainable and c.prompt_ids and c.response_ids for c in detail.llm_calls)
        assert_exact_ids(detail)
        assert {s.name for s in detail.spans if s.attributes.get(attr.SPAN_KIND) == "agent"} == {
            "agent:planner",
            "agent:solver",
        }

    first, second = (_tools(d) for d in details)
    assert [t[:4] for t in first] == [
        ("delegate_task_to_members", "ok", None, "planner"),
        ("calculator", "ok", None, "solver"),
    ]
    assert [t[4] for t in first] == [{"task": "What is 12 * 7?"}, {"expression": "12*7"}]
    assert second[1][:5] == ("calculator", "error", "division by zero", "solver", {"expression": "9/0"})

    episodes, stats = build_episodes(details, AgentSelection.parse("solver"))
    trained = [t.agent_name for e in episodes for t in e.transitions]
    assert trained and set(trained) == {"solver"}
    assert stats.dropped_calls["agent not selected"] == sum(
        c.agent_name == "planner" for d in details for c in d.llm_calls
    )
