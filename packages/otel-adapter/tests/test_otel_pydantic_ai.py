"""Pydantic AI through agl_otel: its own GenAI spans name each agent's calls (an agent run inside another agent's
tool gives its own name, the caller gets its back), its tool spans carry ok/error, through real `agl serve` and
`agl worker` processes against the scripted backend."""

from __future__ import annotations

from typing import Any

import pytest

from agl.client import Client
from agl.common.processes import ServerProcess
from agl.learn.selection import AgentSelection
from agl.learn.transitions import build_episodes
from otel_support import check_planner_and_solver, run_example, tool_spans, tools_seen

pytest.importorskip("pydantic_ai", reason="Pydantic AI is not installed: pip install 'pydantic-ai-slim[openai]'")


def test_delegation_and_a_failing_tool_through_a_real_worker(
    agl_server: ServerProcess, agl_client: Client, agl_workers: Any
) -> None:
    tasks = [{"question": "What is 12 * 7?", "answer": 84}, {"question": "What is 9 / 0?", "answer": 1}]
    details = run_example(
        "pydantic_ai_delegation", agl_server, agl_client, agl_workers, tasks, statuses=["succeeded", "succeeded"]
    )
    for detail in details:
        check_planner_and_solver(detail)
    assert [[r.value for r in d.rewards] for d in details] == [[1.0], [0.0]]
    assert tools_seen(details[0]) == [("ask_solver", "ok", "planner"), ("calculator", "ok", "solver")]
    # ModelRetry: the model is asked again; the tool's span is in error with the exception it recorded
    assert tools_seen(details[1]) == [("ask_solver", "ok", "planner"), ("calculator", "error", "solver")]
    (calc,) = [s for s in tool_spans(details[1]) if s.status.value == "error"]
    assert "division by zero" in (calc.status_message or "")

    episodes, stats = build_episodes(details, AgentSelection.parse("solver"))
    assert [t.agent_name for e in episodes for t in e.transitions] == ["solver"] * 4
    assert stats.dropped_calls == {"agent not selected": 4}
