"""Pydantic AI through agl_otel: its own GenAI spans name each agent's calls (an agent inside another agent's tool
gives its own name, the caller gets its back), its tool spans carry ok/error, through real `agl serve` and
`agl worker` processes against the scripted backend."""

from __future__ import annotations

from typing import Any

import pytest

from agl.client import Client
from agl.processes import ServerProcess
from agl.selection import AgentSelection
from agl.testing.fixtures import wait_rollouts
from agl.tracing import attributes as attr
from agl.transitions import build_episodes
from otel_support import EXAMPLES, agents_of_calls, assert_exact_ids, tool_spans

pytest.importorskip("pydantic_ai", reason="Pydantic AI is not installed: pip install 'pydantic-ai-slim[openai]'")


def test_delegation_and_a_failing_tool_through_a_real_worker(
    agl_server: ServerProcess, agl_client: Client, agl_workers: Any
) -> None:
    tasks = [{"question": "What is 12 * 7?", "answer": 84}, {"question": "What is 9 / 0?", "answer": 1}]
    ids = [r.id for task in tasks for r in agl_client.enqueue(task)]
    agl_workers(f"{EXAMPLES / 'pydantic_ai_delegation.py'}:solve", agl_server.url)
    assert [r.status.value for r in wait_rollouts(agl_client, ids, timeout=120)] == ["succeeded", "succeeded"]
    details = [agl_client.rollout_detail(i) for i in ids]
    for detail in details:
        detail.llm_calls.sort(key=lambda c: c.seq)
        # planner asks the solver (a tool); the solver calls its calculator, then answers; the planner answers
        assert agents_of_calls(detail) == ["planner", "solver", "solver", "planner"]
        assert all(c.trainable and c.prompt_ids and c.response_ids for c in detail.llm_calls)
        assert_exact_ids(detail)
        # each call's prompt is the one its agent sent: Pydantic AI's instructions as the system message
        assert [c.request["messages"][0]["content"].split(".")[0] for c in detail.llm_calls] == [
            "You are planner",
            "You are solver",
            "You are solver",
            "You are planner",
        ]
    assert [[r.value for r in d.rewards] for d in details] == [[1.0], [0.0]]
    ok, failed = (
        [(s.attributes[attr.TOOL_NAME], s.status.value, s.agent_name) for s in tool_spans(d)] for d in details
    )
    assert sorted(ok) == [("ask_solver", "ok", "planner"), ("calculator", "ok", "solver")]
    assert sorted(failed) == [("ask_solver", "ok", "planner"), ("calculator", "error", "solver")]
    (calc,) = [s for s in tool_spans(details[1]) if s.attributes[attr.TOOL_NAME] == "calculator"]
    assert "division by zero" in (calc.status_message or "")

    episodes, stats = build_episodes(details, AgentSelection.parse("solver"))
    assert [t.agent_name for e in episodes for t in e.transitions] == ["solver"] * 4
    assert stats.dropped_calls == {"agent not selected": 4}
