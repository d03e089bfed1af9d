"""LangGraph through OpenInference's LangChain instrumentor and agl_otel: the supervisor's and the solver's calls each
under their own agent, though the instrumentor names neither until their spans end (agl_otel.runtime_agents), the
solver's calculator spans with their real arguments and ok/error, through real `agl serve` and `agl worker`
processes against the scripted backend."""

from __future__ import annotations

from typing import Any

import pytest

from agl.client import Client
from agl.common.processes import ServerProcess
from agl.learn.selection import AgentSelection
from agl.learn.transitions import build_episodes
from otel_support import assert_exact_ids, run_example, tool_spans

pytest.importorskip("langgraph", reason="LangGraph is not installed: pip install langgraph langchain-openai")
pytest.importorskip("langchain.agents", reason="LangChain is not installed: pip install langchain")
pytest.importorskip(
    "openinference.instrumentation.langchain",
    reason="OpenInference's LangChain instrumentation is not installed: pip install openinference-instrumentation-langchain",
)

EXAMPLE = "langgraph_openinference_supervisor"


def test_a_supervisor_and_its_sub_agent_through_a_real_worker(
    agl_server: ServerProcess, agl_client: Client, agl_workers: Any
) -> None:
    tasks = [{"question": "What is 12 * 7?", "answer": 84}, {"question": "What is 9 / 0?", "answer": 0}]
    details = run_example(EXAMPLE, agl_server, agl_client, agl_workers, tasks, statuses=["succeeded", "succeeded"])
    for detail in details:
        # supervisor asks, solver calls its calculator, solver answers, supervisor answers: each under its agent
        sent = [(c.agent_name, str(c.request["messages"][0]["content"]).split(".")[0]) for c in detail.llm_calls]
        assert sent == [
            ("supervisor", "You are supervisor"),
            ("solver", "You are solver"),
            ("solver", "You are solver"),
            ("supervisor", "You are supervisor"),
        ], sent
        assert all(c.trainable for c in detail.llm_calls)
        assert_exact_ids(detail)
    spans = [
        [(s.attributes.get("agl.tool.name"), s.status.value, s.agent_name) for s in tool_spans(d)] for d in details
    ]
    print(spans)
    first, second = (tool_spans(d) for d in details)
    calculator = [s for s in first if s.name == "tool:calculator"]
    assert [(s.status.value, s.agent_name) for s in calculator] == [("ok", "solver")]
    assert "12*7" in str(calculator[0].attributes)  # the real arguments, not the tool's schema
    failed = [s for s in second if s.name == "tool:calculator"]
    assert [(s.status.value, s.agent_name) for s in failed] == [("error", "solver")], failed

    episodes, stats = build_episodes(details, AgentSelection.parse("solver"))
    trained = [t.agent_name for e in episodes for t in e.transitions]
    assert trained and set(trained) == {"solver"}
    assert stats.dropped_calls["agent not selected"] == 4
