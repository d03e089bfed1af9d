"""CrewAI through OpenInference spans and agl_otel: the planner's and the solver's calls each under their own agent
(the request each carries is that agent's), the tool spans with their arguments and ok/error, through real
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
from agl_otel.conventions import match
from otel_support import check_planner_and_solver, run_example, tool_spans

pytest.importorskip("crewai", reason="CrewAI is not installed: pip install crewai")
pytest.importorskip(
    "openinference.instrumentation.crewai",
    reason="OpenInference's CrewAI instrumentation is not installed: pip install openinference-instrumentation-crewai",
)

# CrewAI's anonymous telemetry and trace upload, off in the worker
CREWAI_ENV = {"CREWAI_DISABLE_TELEMETRY": "true", "CREWAI_TRACING_ENABLED": "false"}


def test_the_task_spans_name_their_agent_when_they_start() -> None:
    # what openinference-instrumentation-crewai 1.1.21 gives the span processor when a span starts: its name and kind
    at_start = {"openinference.span.kind": "AGENT"}
    found = match("solver._execute_core", at_start, "agent")
    assert found is not None and found.name == "solver"
    found = match("solver.kickoff", at_start, "agent")  # a lone Agent.kickoff()
    assert found is not None and found.name == "solver"
    # the crew's own span is a CHAIN, no agent
    assert match("Crew_1234.kickoff", {"openinference.span.kind": "CHAIN"}, "agent") is None


def _tools(detail: Any) -> list[tuple[str, str, str | None, str | None, Any, Any]]:
    """(tool, status, error, agent, arguments, result) of each tool span, in start order."""
    return [
        (
            str(s.attributes[attr.TOOL_NAME]),
            s.status.value,
            s.status_message,
            s.agent_name,
            json.loads(str(s.attributes[attr.TOOL_ARGUMENTS])),
            s.attributes.get(attr.TOOL_RESULT),
        )
        for s in tool_spans(detail)
    ]


def test_a_crew_of_two_agents_and_a_failing_tool_through_a_real_worker(
    agl_server: ServerProcess, agl_client: Client, agl_workers: Any
) -> None:
    tasks = [{"question": "What is 12 * 7?", "answer": 84}, {"question": "What is 9 / 0?", "answer": 0}]

    def workers(spec: str, url: str) -> Any:
        return agl_workers(spec, url, env=CREWAI_ENV)

    # CrewAI hands a tool's exception back to the model as the tool's result: both rollouts succeed
    details = run_example(
        "crewai_openinference_crew",
        agl_server,
        agl_client,
        workers,
        tasks,
        statuses=["succeeded", "succeeded"],
        timeout=180,
    )
    for detail in details:
        # the planner plans; the solver calls its calculator, then answers; the planner reports
        check_planner_and_solver(detail)
        agent_spans = [s for s in detail.spans if s.attributes.get(attr.SPAN_KIND) == "agent"]
        assert sorted(s.name for s in agent_spans) == ["agent:planner", "agent:planner", "agent:solver"]
    assert details[0].rollout.final_reward == 1.0

    first, second = (_tools(d) for d in details)
    assert first == [("calculator", "ok", None, "solver", {"expression": "12*7"}, "84")]
    assert [t[:5] for t in second] == [("calculator", "error", "division by zero", "solver", {"expression": "9/0"})]

    episodes, stats = build_episodes(details, AgentSelection.parse("solver"))
    trained = [t.agent_name for e in episodes for t in e.transitions]
    assert trained and set(trained) == {"solver"}
    assert stats.dropped_calls["agent not selected"] == sum(
        c.agent_name == "planner" for d in details for c in d.llm_calls
    )
