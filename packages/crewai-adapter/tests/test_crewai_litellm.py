"""Models that CrewAI sends through LiteLLM (`LLM(model="openai/...", ..., is_litellm=True)`) are attributed like
native ones: LiteLLM sends through the OpenAI SDK over httpx, which agl tags.

Runs only where litellm is installed (`pip install "crewai[litellm]"`); the pinned all-in-one environment has none.

Tools take another road than on the native provider. CrewAI asks LiteLLM whether a model supports native function
calling, and LiteLLM answers from its model map, which does not know the policy being trained: CrewAI then falls
back to its text (ReAct) tool loop. The tools are described in the system prompt, requests carry no `tools`, and
the model must write `Action: <tool>` / `Action Input: {...}`. The scripted upstream calls tools only when a
request offers `tools`, and otherwise echoes the last user message; so here a task spells out the ReAct step
itself, and the upstream's echo of the task is the model choosing the tool. After the tool CrewAI asks "Analyze the
tool result..."; the echo of that has neither an action nor "Final Answer:", which CrewAI takes as the answer. An
agent with such a task makes two calls around one tool run, as on the native provider; given the plain question
the native tests ask ("What is 6 * 7?"), it makes one call and runs no tool.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

litellm = pytest.importorskip(
    "litellm",
    reason='litellm is not installed: these tests run where crewai[litellm] is ("pip install crewai[litellm]")',
)

from crewai import LLM, Agent, Crew, Task  # noqa: E402
from crewai.tools import tool  # noqa: E402
from crewai.tools.tool_failure import ToolFailure  # noqa: E402
from crewai_helpers import run_one  # noqa: E402

import agl  # noqa: E402
from agl.client import Client  # noqa: E402
from agl.common.processes import ServerProcess, start_server  # noqa: E402
from agl.learn.air import air_rewards  # noqa: E402
from agl.schema import LLMCall, RolloutDetail, Span  # noqa: E402

pytestmark = pytest.mark.usefixtures("instrumented")


def litellm_model(llm: agl.LLM, *, stream: bool = False) -> LLM:
    """The README's model line, routed to LiteLLM."""
    model = LLM(model=f"openai/{llm.model}", base_url=llm.base_url, api_key=llm.api_key, is_litellm=True, stream=stream)
    assert type(model) is LLM  # CrewAI's LiteLLM client: `LLM(...)` without `is_litellm` gives its native provider
    return model


def react_step(tool_name: str, arguments: str) -> str:
    """A task whose echo by the scripted upstream is one step of CrewAI's text tool loop."""
    return f"Thought: I use the {tool_name} tool.\nAction: {tool_name}\nAction Input: {arguments}\n"


def calls_of(detail: RolloutDetail) -> list[LLMCall]:
    return sorted(detail.llm_calls, key=lambda c: c.seq)


def tool_spans(detail: RolloutDetail) -> list[Span]:
    return sorted((s for s in detail.spans if s.name.startswith("tool:")), key=lambda s: s.start_time)


def assert_sent_by(calls: list[LLMCall], roles: list[str]) -> None:
    """Each call carries the role of the agent that really sent it (CrewAI puts the role in the system prompt)."""
    assert [(c.agent_name, c.attribution.value) for c in calls] == [(role, "scope") for role in roles]
    assert all(c.request["messages"][0]["content"].startswith(f"You are {c.agent_name}.") for c in calls)
    assert all(c.trainable and c.response_ids for c in calls)


def test_a_model_litellm_does_not_know_gets_crewais_text_tool_loop(
    example: ModuleType, agl_server: ServerProcess, agl_client: Client
) -> None:
    """Why the native tests' Solver makes one call here, not two: no `tools` reach the model, no tool runs."""

    @agl.rollout
    def solver_alone(task: Any, llm: agl.LLM) -> None:
        model = litellm_model(llm)
        assert not model.supports_function_calling()  # LiteLLM's model map does not know the policy
        solver = Agent(role="Solver", goal="Compute.", backstory="You compute.", tools=[example.calculator], llm=model)
        assert solver.kickoff("What is 6 * 7?").raw.startswith("Echo:")

    detail = run_one(solver_alone, agl_server, agl_client, "t")
    (call,) = calls_of(detail)
    assert_sent_by([call], ["Solver"])
    assert "tools" not in call.request
    assert "Tool Name: calculator" in call.request["messages"][0]["content"]  # described in the prompt instead
    assert tool_spans(detail) == []


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_standalone_agents_sync_and_async(
    stream: bool, example: ModuleType, agl_server: ServerProcess, agl_client: Client
) -> None:
    @agl.rollout
    def two_agents_without_a_crew(task: Any, llm: agl.LLM) -> None:
        model = litellm_model(llm, stream=stream)
        solver = Agent(role="Solver", goal="Compute.", backstory="You compute.", tools=[example.calculator], llm=model)
        checker = Agent(role="Checker", goal="Check.", backstory="You check.", llm=model)
        answer = solver.kickoff(react_step("calculator", '{"expression": "6*7"}'))
        asyncio.run(checker.kickoff_async(f"Check this: {answer.raw}"))

    detail = run_one(two_agents_without_a_crew, agl_server, agl_client, "t")
    calls = calls_of(detail)
    assert_sent_by(calls, ["Solver", "Solver", "Checker"])
    assert [c.stream for c in calls] == [stream] * 3
    (span,) = tool_spans(detail)
    assert (span.name, span.status.value, span.agent_name) == ("tool:calculator", "ok", "Solver")
    assert span.attributes["agl.tool.result"] == "42" and '"6*7"' in span.attributes["agl.tool.arguments"]
    assert span.attributes["agl.after_llm_seq"] == calls[0].seq
    # the text loop hands the result back in the conversation, not as a `tool` message
    assert "Observation: 42" in calls[1].request["messages"][-2]["content"]


def research_crew(llm: agl.LLM, calculator: Any, *, stream: bool = False) -> Crew:
    """The example's two agents on a LiteLLM model, the Researcher's task written as one ReAct step."""
    model = litellm_model(llm)
    researcher = Agent(
        role="Researcher", goal="Compute exactly.", backstory="You use the calculator.", tools=[calculator], llm=model
    )
    writer = Agent(role="Writer", goal="Report the answer.", backstory="You write short reports.", llm=model)
    research = Task(
        description=react_step("calculator", '{"expression": "12+30"}'), expected_output="a number", agent=researcher
    )
    report = Task(description="Report the answer", expected_output="one sentence", agent=writer, context=[research])
    return Crew(agents=[researcher, writer], tasks=[research, report], stream=stream)


def assert_research_crew_trace(detail: RolloutDetail) -> None:
    calls = calls_of(detail)
    assert_sent_by(calls, ["Researcher", "Researcher", "Writer"])
    (span,) = tool_spans(detail)
    assert (span.name, span.status.value, span.agent_name) == ("tool:calculator", "ok", "Researcher")
    assert span.attributes["agl.tool.result"] == "42"
    agents = {s.name: s for s in detail.spans if s.name.startswith("agent:")}
    assert sorted(agents) == ["agent:Researcher", "agent:Writer"]
    assert span.parent_id == agents["agent:Researcher"].span_id


@pytest.mark.parametrize("method", ["kickoff", "akickoff", "kickoff_async"])
def test_crew_attributes_each_call_to_its_agent_role(
    method: str, example: ModuleType, agl_server: ServerProcess, agl_client: Client
) -> None:
    @agl.rollout
    def crew_on_litellm(task: Any, llm: agl.LLM) -> None:
        research_crew(llm, example.calculator).kickoff()

    @agl.rollout
    async def crew_on_litellm_async(task: Any, llm: agl.LLM) -> None:
        await getattr(research_crew(llm, example.calculator), method)()

    detail = run_one(crew_on_litellm if method == "kickoff" else crew_on_litellm_async, agl_server, agl_client, "t")
    assert_research_crew_trace(detail)


def test_streaming_crew_attributes_each_streamed_call(
    example: ModuleType, agl_server: ServerProcess, agl_client: Client
) -> None:
    @agl.rollout
    def streaming_crew_on_litellm(task: Any, llm: agl.LLM) -> None:
        streaming = research_crew(llm, example.calculator, stream=True).kickoff()
        text = "".join(chunk.content for chunk in streaming)  # CrewAI runs the crew in a thread of its own
        assert "Echo:" in text and streaming.result.raw.startswith("Echo:")

    detail = run_one(streaming_crew_on_litellm, agl_server, agl_client, "t")
    assert all(c.stream for c in detail.llm_calls)
    assert_research_crew_trace(detail)


@tool("lookup")
def lookup(city: str) -> Any:
    """Population of a city."""
    return ToolFailure(message="no such city", code="not_found")  # a tool reporting failure without raising


@pytest.mark.parametrize(
    ("tool_name", "arguments", "runs", "status_message", "observation"),
    [
        # the text loop runs a tool that raises up to three times before it shows the model the error
        (
            "calculator",
            '{"expression": "7/0"}',
            3,
            "ZeroDivisionError: division by zero",
            "This was the error: division by zero.",
        ),
        ("lookup", '{"city": "Atlantis"}', 1, "tool_reported: no such city (code: not_found)", "no such city"),
    ],
    ids=["raises", "reports-failure"],
)
def test_a_failing_tool_is_an_error_span(
    tool_name: str,
    arguments: str,
    runs: int,
    status_message: str,
    observation: str,
    example: ModuleType,
    agl_server: ServerProcess,
    agl_client: Client,
) -> None:
    @agl.rollout
    def agent_with_a_failing_tool(task: Any, llm: agl.LLM) -> None:
        analyst = Agent(
            role="Analyst",
            goal="Answer with data.",
            backstory="You look things up.",
            tools=[lookup, example.calculator],
            llm=litellm_model(llm),
        )
        question = Task(description=react_step(tool_name, arguments), expected_output="a number", agent=analyst)
        Crew(agents=[analyst], tasks=[question]).kickoff()

    detail = run_one(agent_with_a_failing_tool, agl_server, agl_client, "t")
    calls = calls_of(detail)
    assert_sent_by(calls, ["Analyst", "Analyst"])
    spans = tool_spans(detail)
    assert [(s.name, s.status.value, s.status_message, s.agent_name) for s in spans] == [
        (f"tool:{tool_name}", "error", status_message, "Analyst")
    ] * runs
    assert all(s.attributes["agl.after_llm_seq"] == calls[0].seq for s in spans)
    # CrewAI showed the model the failure as an observation; only the spans say the call failed ...
    shown = calls[1].request["messages"][-2]["content"]
    assert "Observation:" in shown and observation in shown.split("Observation:")[-1]
    # ... and automatic intermediate rewarding reads them: penalties right after the call that asked for the tool
    penalties = [r for r in air_rewards(detail) if r.name == "air:tool_status"]
    assert len(penalties) == runs and all(r.value < 0 and r.after_llm_seq == calls[0].seq for r in penalties)


def litellm_tool_calls_unavailable() -> str | None:
    """Why LiteLLM cannot send native tool calls here, or None. LiteLLM imports its MCP gateway for every request
    that offers `tools`; litellm 1.106 needs mcp >= 2.2 there, while crewai 1.15 pins mcp < 2."""
    try:
        importlib.import_module("litellm.responses.mcp.chat_completions_handler")
    except ImportError as exc:
        return f"LiteLLM fails every request with `tools` in this environment: {exc}"
    return None


NO_TOOL_CALLS = litellm_tool_calls_unavailable()
SERVED_MODEL = "agl-policy-with-tools"  # registered with LiteLLM below; no other test uses it


@pytest.fixture
def server_of_a_registered_model(tmp_path: Path, agl_upstream: str) -> Iterator[ServerProcess]:
    """`agl serve` under a model name of its own: LiteLLM's registration is process-wide and cannot be undone."""
    server = start_server(tmp_path / "run", upstream=agl_upstream, extra_args=[f"--served-model={SERVED_MODEL}"])
    yield server
    server.stop()


@pytest.mark.skipif(NO_TOOL_CALLS is not None, reason=str(NO_TOOL_CALLS))
def test_native_tool_calls_once_the_model_is_registered_with_litellm(
    example: ModuleType, server_of_a_registered_model: ServerProcess
) -> None:
    @agl.rollout
    def two_agents_with_native_tools(task: Any, llm: agl.LLM) -> None:
        assert llm.model == SERVED_MODEL
        litellm.register_model(
            {f"openai/{llm.model}": {"litellm_provider": "openai", "mode": "chat", "supports_function_calling": True}}
        )
        model = litellm_model(llm)
        assert model.supports_function_calling()
        solver = Agent(role="Solver", goal="Compute.", backstory="You compute.", tools=[example.calculator], llm=model)
        checker = Agent(role="Checker", goal="Check.", backstory="You check.", llm=model)
        answer = solver.kickoff("What is 6 * 7?")
        assert "42" in answer.raw
        asyncio.run(checker.kickoff_async(f"Check this: {answer.raw}"))

    with Client(server_of_a_registered_model.url) as client:
        detail = run_one(two_agents_with_native_tools, server_of_a_registered_model, client, "t")
    calls = calls_of(detail)
    assert_sent_by(calls, ["Solver", "Solver", "Checker"])
    assert [t["function"]["name"] for t in calls[0].request["tools"]] == ["calculator"]
    assert calls[1].request["messages"][-1] == {
        "role": "tool",
        "tool_call_id": calls[1].request["messages"][-2]["tool_calls"][0]["id"],
        "name": "calculator",
        "content": "42",
    }
    assert [(s.name, s.status.value, s.agent_name) for s in tool_spans(detail)] == [("tool:calculator", "ok", "Solver")]
