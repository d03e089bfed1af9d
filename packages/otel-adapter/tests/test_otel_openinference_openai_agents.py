"""The OpenAI Agents SDK through OpenInference spans and agl_otel (not agl's native adapter): the planner's and the
solver's (an agent as the planner's tool) calls each under their own agent, the tool spans with their arguments and
ok/error, through real `agl serve` and `agl worker` processes against the scripted backend."""

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

pytest.importorskip("agents", reason="the OpenAI Agents SDK is not installed: pip install openai-agents")
pytest.importorskip(
    "openinference.instrumentation.openai_agents",
    reason="OpenInference's OpenAI Agents instrumentation is not installed: "
    "pip install openinference-instrumentation-openai-agents",
)


# openinference-instrumentation-openai-agents 2.6.0 starts an agent's span with the agent's name as the span's whole
# name and only `openinference.span.kind` = AGENT; `agent.name` / `graph.node.id` come at the span's end. No field
# of agl_otel.conventions reads a span's whole name (a name from the span's name needs a prefix or suffix to take
# off), and the trace's root span (`Agent workflow`, the SDK's workflow name) is an AGENT span too
def _instructions_of(call: Any) -> str:
    return str(call.request["messages"][0]["content"]).split(".")[0].removeprefix("You are ")


def test_an_agent_as_tool_and_a_failing_tool_through_a_real_worker(
    agl_server: ServerProcess, agl_client: Client, agl_workers: Any
) -> None:
    tasks = [{"question": "What is 12 * 7?", "answer": 84}, {"question": "What is 9 / 0?", "answer": 0}]
    details = run_example(
        "openinference_openai_agents_as_tool",
        agl_server,
        agl_client,
        agl_workers,
        tasks,
        statuses=["succeeded", "succeeded"],
    )
    for detail in details:
        # planner asks the solver, the solver calls its calculator and answers, the planner answers
        assert [_instructions_of(c) for c in detail.llm_calls] == ["planner", "solver", "solver", "planner"]
        assert all(c.trainable for c in detail.llm_calls)
        assert_exact_ids(detail)

    # the tool spans, recognised when they end: the real arguments, the result, ok/error
    first, second = (
        [(s.attributes[attr.TOOL_NAME], s.status.value, s.status_message) for s in tool_spans(d)] for d in details
    )
    assert [(name, status) for name, status, _ in first] == [("solver", "ok"), ("calculator", "ok")]
    assert second[0][:2] == ("solver", "ok")  # the solver answered, with the failure as its tool's result
    assert second[1][:2] == ("calculator", "error") and "division by zero" in str(second[1][2])
    solver, calculator = tool_spans(details[0])
    assert json.loads(str(solver.attributes[attr.TOOL_ARGUMENTS])) == {"input": "What is 12 * 7?"}
    assert solver.attributes[attr.TOOL_RESULT] == "The answer is 84"
    assert json.loads(str(calculator.attributes[attr.TOOL_ARGUMENTS])) == {"expression": "12*7"}
    assert calculator.attributes[attr.TOOL_RESULT] == "84"

    for detail in details:
        assert agents_of_calls(detail) == ["planner", "solver", "solver", "planner"]
        assert {s.name for s in detail.spans if s.attributes.get(attr.SPAN_KIND) == "agent"} == {
            "agent:planner",
            "agent:solver",
        }
        assert [(s.attributes[attr.TOOL_NAME], s.agent_name) for s in tool_spans(detail)] == [
            ("solver", "planner"),
            ("calculator", "solver"),
        ]
    episodes, stats = build_episodes(details, AgentSelection.parse("solver"))
    trained = [t.agent_name for e in episodes for t in e.transitions]
    assert trained and set(trained) == {"solver"}
    assert stats.dropped_calls["agent not selected"] == sum(
        c.agent_name == "planner" for d in details for c in d.llm_calls
    )
