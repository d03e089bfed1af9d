"""Each tool execution becomes a tool span: ok, or error with a message, even when CrewAI hides the failure
from everyone but the model (it catches the exception, or the tool returns a `ToolFailure`)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
from crewai import LLM, Agent, Crew, Task
from crewai.tools import tool
from crewai.tools.tool_failure import ToolFailure
from crewai_helpers import run_one

import agl
from agl.client import Client
from agl.common.processes import ServerProcess
from agl.learn.air import air_rewards

pytestmark = pytest.mark.usefixtures("instrumented")


def test_a_tool_that_raises_is_an_error_span(
    example: ModuleType, agl_server: ServerProcess, agl_client: Client
) -> None:
    detail = run_one(example.research_crew, agl_server, agl_client, {"question": "What is 7 / 0?", "answer": -1})
    (span,) = [s for s in detail.spans if s.name == "tool:calculator"]
    assert (span.status.value, span.status_message) == ("error", "ZeroDivisionError: division by zero")
    assert span.agent_name == "Researcher" and '"7/0"' in span.attributes["agl.tool.arguments"]
    # CrewAI turned the exception into a message for the model: only the span says the call failed
    tool_message = next(m for c in detail.llm_calls for m in c.request["messages"] if m["role"] == "tool")
    assert tool_message["content"] == "Error executing tool: division by zero"
    # ... and automatic intermediate rewarding reads it: a penalty right after the call that asked for the tool
    (penalty,) = [r for r in air_rewards(detail) if r.name == "air:tool_status"]
    first = min(c.seq for c in detail.llm_calls)
    assert penalty.value < 0 and penalty.after_llm_seq == first
    assert [r.value for r in detail.rewards if r.name == "final"] == [0.0]


@tool("lookup")
def lookup(city: str) -> Any:
    """Population of a city."""
    return ToolFailure(message="no such city", code="not_found")  # a tool reporting failure without raising


@tool("calculator")
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    return "42"


def test_tool_spans_follow_each_call_with_its_own_status(agl_server: ServerProcess, agl_client: Client) -> None:
    @agl.rollout
    def crew_with_two_tools(task: Any, llm: agl.LLM) -> None:
        model = LLM(model=f"openai/{llm.model}", base_url=llm.base_url, api_key=llm.api_key)
        agent = Agent(
            role="Analyst",
            goal="Answer with data.",
            backstory="agl-tools: lookup, calculator\nagl-say: done with {tool}",  # the scripted model's orders
            tools=[lookup, calculator],
            llm=model,
        )
        task_ = Task(description="How many people live in Atlantis, times 2?", expected_output="a number", agent=agent)
        Crew(agents=[agent], tasks=[task_]).kickoff()

    detail = run_one(crew_with_two_tools, agl_server, agl_client, "t")
    tools = sorted((s for s in detail.spans if s.name.startswith("tool:")), key=lambda s: s.start_time)
    assert [(s.name, s.status.value, s.status_message) for s in tools] == [
        ("tool:lookup", "error", "tool_reported: no such city (code: not_found)"),
        ("tool:calculator", "ok", None),
    ]
    assert all(s.agent_name == "Analyst" for s in tools)
    calls = sorted(detail.llm_calls, key=lambda c: c.seq)
    assert [s.attributes["agl.after_llm_seq"] for s in tools] == [calls[0].seq, calls[1].seq]
