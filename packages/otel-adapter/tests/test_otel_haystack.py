"""Haystack through OpenInference spans and agl_otel: the planner Agent's and the solver Agent's calls each under
their own agent (the request each carries is that agent's), through real `agl serve` and `agl worker` processes
against the scripted backend. Haystack's agents have no names: the example names each run with OpenInference's
`using_metadata`, which the Haystack rows of agl_otel.conventions read."""

from __future__ import annotations

from typing import Any

import pytest

from agl.client import Client
from agl.common import attributes as attr
from agl.common.processes import ServerProcess
from agl.learn.selection import AgentSelection
from agl.learn.transitions import build_episodes
from otel_support import check_planner_and_solver, run_example, tool_spans

pytest.importorskip("haystack", reason="Haystack is not installed: pip install haystack-ai")
pytest.importorskip(
    "openinference.instrumentation.haystack",
    reason="OpenInference's Haystack instrumentation is not installed: pip install openinference-instrumentation-haystack",
)


def test_an_agent_as_tool_and_a_failing_tool_through_a_real_worker(
    agl_server: ServerProcess, agl_client: Client, agl_workers: Any
) -> None:
    tasks = [{"question": "What is 12 * 7?", "answer": 84}, {"question": "What is 9 / 0?", "answer": 0}]
    details = run_example(
        "haystack_agent_tool", agl_server, agl_client, agl_workers, tasks, statuses=["succeeded", "succeeded"]
    )
    for detail in details:
        # planner asks the solver, the solver calls its calculator and answers, the planner answers; each call under
        # the agent whose instructions it carries, with exact token ids
        check_planner_and_solver(detail)
        assert {s.name for s in detail.spans if s.attributes.get(attr.SPAN_KIND) == "agent"} == {
            "agent:planner",
            "agent:solver",
        }
    # the calculator's failure reaches the solver's model as the tool's result
    assert "division by zero" in str(details[1].llm_calls[2].request["messages"][-1]["content"])

    episodes, stats = build_episodes(details, AgentSelection.parse("solver"))
    trained = [t.agent_name for e in episodes for t in e.transitions]
    assert trained and set(trained) == {"solver"}
    assert stats.dropped_calls["agent not selected"] == sum(
        c.agent_name == "planner" for d in details for c in d.llm_calls
    )

    if not any(tool_spans(d) for d in details):
        # Haystack 3.x's Agent calls its tools itself (haystack.components.agents.tool_calling), not through a
        # ToolInvoker component, and openinference-instrumentation-haystack 0.1.46 spans component runs only: no
        # span (and no TOOL kind) carries a tool call's name, arguments, result or failure
        pytest.xfail("openinference-instrumentation-haystack 0.1.46 emits no span for an Agent's tool calls")
    first, second = (
        [(s.attributes[attr.TOOL_NAME], s.status.value, s.agent_name) for s in tool_spans(d)] for d in details
    )
    assert first == [("solver", "ok", "planner"), ("calculator", "ok", "solver")]
    assert second[-1] == ("calculator", "error", "solver")
