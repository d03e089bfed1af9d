"""Google ADK through agl_otel (its models through LiteLLM): its own GenAI spans name each agent's calls (an agent used as a tool
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

# ADK pins an older OpenTelemetry SDK than agl-core's OTLP exporter accepts, so it cannot join the pinned
# all-in-one environment: `make test-newest` runs this test in an environment of its own
pytest.importorskip("google.adk", reason="Google ADK is not installed here: pip install google-adk litellm")
pytest.importorskip("litellm", reason="LiteLLM is not installed here: pip install litellm")


def test_an_agent_as_a_tool_and_a_failing_tool_through_a_real_worker(
    agl_server: ServerProcess, agl_client: Client, agl_workers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download of LiteLLM's price list
    tasks = [{"question": "What is 12 * 7?", "answer": 84}, {"question": "What is 9 / 0?", "answer": 1}]
    ids = [r.id for task in tasks for r in agl_client.enqueue(task, max_attempts=1)]
    agl_workers(f"{EXAMPLES / 'google_adk_agent_tool.py'}:solve", agl_server.url)
    # ADK lets a tool's exception end the run (its default): the division by zero fails its rollout
    assert [r.status.value for r in wait_rollouts(agl_client, ids, timeout=120)] == ["succeeded", "failed"]
    detail, failed = (agl_client.rollout_detail(i) for i in ids)
    detail.llm_calls.sort(key=lambda c: c.seq)
    # the planner calls the solver (a tool); the solver calls its calculator, then answers; the planner answers
    assert agents_of_calls(detail) == ["planner", "solver", "solver", "planner"]
    assert all(c.trainable and c.prompt_ids and c.response_ids for c in detail.llm_calls)
    assert_exact_ids(detail)
    # each call's prompt is the one its agent sent: the agent's instructions as the system message
    assert [c.request["messages"][0]["content"].split(".")[0] for c in detail.llm_calls] == [
        "You are planner",
        "You are solver",
        "You are solver",
        "You are planner",
    ]
    assert [r.value for r in detail.rewards] == [1.0]
    ok = [(s.attributes[attr.TOOL_NAME], s.status.value, s.agent_name) for s in tool_spans(detail)]
    assert sorted(ok) == [("calculator", "ok", "solver"), ("solver", "ok", "planner")]
    # the failed attempt keeps what it did: the planner's and the solver's calls, the calculator's error
    assert agents_of_calls(failed)[:2] == ["planner", "solver"]
    calc = [s for s in tool_spans(failed) if s.attributes[attr.TOOL_NAME] == "calculator"]
    assert [(s.status.value, s.agent_name) for s in calc] == [("error", "solver")]
    assert "ZeroDivisionError" in (calc[0].status_message or "")

    episodes, stats = build_episodes([detail], AgentSelection.parse("solver"))
    assert [t.agent_name for e in episodes for t in e.transitions] == ["solver"] * 2
    assert stats.dropped_calls == {"agent not selected": 2}
