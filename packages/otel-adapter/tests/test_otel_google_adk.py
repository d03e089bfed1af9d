"""Google ADK through agl_otel (its models through LiteLLM): its own GenAI spans name each agent's calls (an
AgentTool gives its agent's name, the caller gets its back), its tool spans carry ok/error, through real
`agl serve` and `agl worker` processes against the scripted backend."""

from __future__ import annotations

from typing import Any

import pytest

from agl.client import Client
from agl.common.processes import ServerProcess
from agl.learn.selection import AgentSelection
from agl.learn.transitions import build_episodes
from otel_support import agents_of_calls, check_planner_and_solver, run_example, tool_spans, tools_seen

# ADK pins an older OpenTelemetry SDK than agl-core's OTLP exporter accepts, so it cannot join the pinned
# all-in-one environment: `make test-newest` runs this test in an environment of its own
pytest.importorskip("google.adk", reason="Google ADK is not installed here: pip install google-adk litellm")
pytest.importorskip("litellm", reason="LiteLLM is not installed here: pip install litellm")


def test_an_agent_tool_and_a_failing_tool_through_a_real_worker(
    agl_server: ServerProcess, agl_client: Client, agl_workers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download of LiteLLM's price list
    tasks = [{"question": "What is 12 * 7?", "answer": 84}, {"question": "What is 9 / 0?", "answer": 1}]
    # ADK lets a tool's exception end the run (its default): the division by zero fails its rollout
    detail, failed = run_example(
        "google_adk_agent_tool", agl_server, agl_client, agl_workers, tasks, statuses=["succeeded", "failed"]
    )
    check_planner_and_solver(detail)
    assert [r.value for r in detail.rewards] == [1.0]
    assert tools_seen(detail) == [("calculator", "ok", "solver"), ("solver", "ok", "planner")]
    # the failed attempt keeps what it did: the planner's and the solver's calls, the calculator's error
    assert agents_of_calls(failed)[:2] == ["planner", "solver"]
    # the exception ends the calculator's span and then the solver tool's around it: both in error
    assert tools_seen(failed) == [("calculator", "error", "solver"), ("solver", "error", "planner")]
    assert all("ZeroDivisionError" in (s.status_message or "") for s in tool_spans(failed))

    episodes, stats = build_episodes([detail], AgentSelection.parse("solver"))
    assert [t.agent_name for e in episodes for t in e.transitions] == ["solver"] * 2
    assert stats.dropped_calls == {"agent not selected": 2}
