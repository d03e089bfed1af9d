"""LlamaIndex through OpenInference's LlamaIndex instrumentor and agl_otel: an `AgentWorkflow`'s planner and solver,
and a lone `FunctionAgent`, each call under its own agent, though the instrumentor names no agent until its spans
end (agl_otel.runtime_agents); the calculator's spans with their real arguments and ok/error; through real
`agl serve` and `agl worker` processes against the scripted backend."""

from __future__ import annotations

from typing import Any

import pytest

from agl.client import Client
from agl.common.processes import ServerProcess
from agl.learn.selection import AgentSelection
from agl.learn.transitions import build_episodes
from otel_support import assert_exact_ids, run_example, tool_spans

pytest.importorskip("llama_index.core", reason="LlamaIndex is not installed: pip install llama-index-core")
pytest.importorskip("llama_index.llms.openai_like", reason="pip install llama-index-llms-openai-like")
pytest.importorskip(
    "openinference.instrumentation.llama_index",
    reason="OpenInference's LlamaIndex instrumentation is not installed: pip install openinference-instrumentation-llama-index",
)

EXAMPLE = "llama_index_agent_workflow"
TASKS = [{"question": "What is 12 * 7?", "answer": 84}, {"question": "What is 9 / 0?", "answer": 0}]


def opening(call: Any) -> str:
    return str(call.request["messages"][0]["content"]).split(".")[0]


def test_an_agent_workflow_hands_off_through_a_real_worker(
    agl_server: ServerProcess, agl_client: Client, agl_workers: Any
) -> None:
    details = run_example(EXAMPLE, agl_server, agl_client, agl_workers, TASKS, statuses=["succeeded", "succeeded"])
    for detail in details:
        # planner hands off, solver calls its calculator, solver answers: each call under the agent that sent it
        sent = [(c.agent_name, opening(c)) for c in detail.llm_calls]
        assert sent == [
            ("planner", "You are planner"),
            ("solver", "You are solver"),
            ("solver", "You are solver"),
        ], sent
        assert all(c.trainable for c in detail.llm_calls)
        assert_exact_ids(detail)
    first, second = ([s for s in tool_spans(d) if s.name == "tool:calculator"] for d in details)
    assert [(s.status.value, s.agent_name) for s in first] == [("ok", "solver")]
    assert "12*7" in str(first[0].attributes)  # the call's arguments, not the tool's schema
    assert [(s.status.value, s.agent_name) for s in second] == [("error", "solver")]
    handoffs = [s for d in details for s in tool_spans(d) if s.name == "tool:handoff"]
    assert [s.agent_name for s in handoffs] == ["planner", "planner"]

    episodes, stats = build_episodes(details, AgentSelection.parse("solver"))
    trained = [t.agent_name for e in episodes for t in e.transitions]
    assert trained and set(trained) == {"solver"}
    assert stats.dropped_calls["agent not selected"] == 2


def test_a_lone_function_agent_through_a_real_worker(
    agl_server: ServerProcess, agl_client: Client, agl_workers: Any
) -> None:
    ids = [r.id for r in agl_client.enqueue(TASKS[0])]
    from agl.testing.fixtures import wait_rollouts
    from otel_support import EXAMPLES

    agl_workers(f"{EXAMPLES / EXAMPLE}.py:solve_alone", agl_server.url)
    assert [r.status.value for r in wait_rollouts(agl_client, ids, timeout=120)] == ["succeeded"]
    (detail,) = [agl_client.rollout_detail(i) for i in ids]
    assert [(c.agent_name, opening(c)) for c in sorted(detail.llm_calls, key=lambda c: c.seq)] == [
        ("solver", "You are solver"),
        ("solver", "You are solver"),
    ]
