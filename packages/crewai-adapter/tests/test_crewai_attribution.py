"""Each LLM call a crew makes is stored with the role of the agent that made it: sync, async, streaming, threads.

The crews run in an in-process `agl.Runner` against a real `agl serve` process and the scripted upstream. With
tools offered and arithmetic in the task, the upstream calls the first tool, answers "The answer is <result>"
after it, and otherwise echoes the user message, so the Writer's report repeats the Researcher's answer.
"""

from __future__ import annotations

import asyncio
from types import ModuleType
from typing import Any

import pytest
from crewai import LLM, Agent, Crew, Task
from crewai.tools import tool
from crewai_helpers import run_one

import agl
from agl.client import Client
from agl.common.processes import ServerProcess
from agl.learn.selection import AgentSelection
from agl.learn.transitions import build_episodes
from agl.schema import LLMCall, RolloutDetail
from agl_crewai import AglListener

QUESTION = {"question": "What is 12 + 30?", "answer": 42}
pytestmark = pytest.mark.usefixtures("instrumented")


def calls_of(detail: RolloutDetail) -> list[LLMCall]:
    return sorted(detail.llm_calls, key=lambda c: c.seq)


def assert_research_crew_trace(detail: RolloutDetail) -> None:
    """The example crew's rollout: two Researcher calls around the calculator, then the Writer's one."""
    calls = calls_of(detail)
    assert [(c.agent_name, c.attribution.value) for c in calls] == [
        ("Researcher", "scope"),
        ("Researcher", "scope"),
        ("Writer", "scope"),
    ]
    # the name is the agent that really sent the request: CrewAI puts the role in the system prompt
    assert all(c.request["messages"][0]["content"].startswith(f"You are {c.agent_name}.") for c in calls)
    assert all(c.trainable and c.response_ids for c in calls)
    (tool,) = [s for s in detail.spans if s.name == "tool:calculator"]
    assert (tool.status.value, tool.agent_name) == ("ok", "Researcher")
    assert tool.attributes["agl.tool.result"] == "42"
    assert '"12+30"' in tool.attributes["agl.tool.arguments"]
    agents = {s.name: s for s in detail.spans if s.name.startswith("agent:")}
    assert sorted(agents) == ["agent:Researcher", "agent:Writer"]
    assert tool.parent_id == agents["agent:Researcher"].span_id  # the tool ran inside the Researcher's step
    assert tool.attributes["agl.after_llm_seq"] == calls[0].seq  # right after the call that asked for it
    assert [r.value for r in detail.rewards if r.name == "final"] == [1.0]


def test_kickoff_attributes_each_call_to_its_agent_role(
    example: ModuleType, agl_server: ServerProcess, agl_client: Client
) -> None:
    detail = run_one(example.research_crew, agl_server, agl_client, QUESTION)
    assert_research_crew_trace(detail)


def test_selection_trains_only_the_selected_roles(
    example: ModuleType, agl_server: ServerProcess, agl_client: Client
) -> None:
    detail = run_one(example.research_crew, agl_server, agl_client, QUESTION)
    (writer_only,), stats = build_episodes([detail], AgentSelection.parse("Writer"))
    assert [t.agent_name for t in writer_only.transitions] == ["Writer"]
    assert stats.dropped_calls["agent not selected"] == 2, stats.dropped_calls
    # the Researcher still ran and is still stored under its own name
    assert [c.agent_name for c in calls_of(detail)].count("Researcher") == 2
    (researcher_only,), _ = build_episodes([detail], AgentSelection.parse("Researcher"))
    assert [t.agent_name for t in researcher_only.transitions] == ["Researcher", "Researcher"]
    (everyone,), _ = build_episodes([detail], AgentSelection.parse(None))
    assert [t.agent_name for t in everyone.transitions] == ["Researcher", "Researcher", "Writer"]


@pytest.mark.parametrize("method", ["akickoff", "kickoff_async"])
def test_async_kickoff_attributes_each_call(
    method: str, example: ModuleType, agl_server: ServerProcess, agl_client: Client
) -> None:
    @agl.rollout
    async def research_crew_async(task: dict[str, Any], llm: agl.LLM) -> float:
        crew = example.build_crew(llm)
        result = await getattr(crew, method)(inputs={"question": task["question"]})
        return float(example.score(result.raw, task["answer"]))

    detail = run_one(research_crew_async, agl_server, agl_client, QUESTION)
    assert_research_crew_trace(detail)


def test_streaming_crew_attributes_each_streamed_call(
    example: ModuleType, agl_server: ServerProcess, agl_client: Client
) -> None:
    @agl.rollout
    def research_crew_streaming(task: dict[str, Any], llm: agl.LLM) -> float:
        streaming = example.build_crew(llm, stream=True).kickoff(inputs={"question": task["question"]})
        text = "".join(chunk.content for chunk in streaming)  # CrewAI runs the crew in a thread of its own
        assert "The answer is 42" in text
        return float(example.score(streaming.result.raw, task["answer"]))

    detail = run_one(research_crew_streaming, agl_server, agl_client, QUESTION)
    assert all(c.stream for c in detail.llm_calls)
    assert_research_crew_trace(detail)


def test_standalone_agent_kickoff_sync_and_async(
    example: ModuleType, agl_server: ServerProcess, agl_client: Client
) -> None:
    @agl.rollout
    def two_agents_without_a_crew(task: Any, llm: agl.LLM) -> None:
        model = LLM(model=f"openai/{llm.model}", base_url=llm.base_url, api_key=llm.api_key)
        solver = Agent(role="Solver", goal="Compute.", backstory="You compute.", tools=[example.calculator], llm=model)
        checker = Agent(role="Checker", goal="Check.", backstory="You check.", llm=model)
        answer = solver.kickoff("What is 6 * 7?")
        assert "42" in answer.raw
        asyncio.run(checker.kickoff_async(f"Check this: {answer.raw}"))

    detail = run_one(two_agents_without_a_crew, agl_server, agl_client, "t")
    assert [c.agent_name for c in calls_of(detail)] == ["Solver", "Solver", "Checker"]
    assert [(s.name, s.status.value, s.agent_name) for s in detail.spans if s.name.startswith("tool:")] == [
        ("tool:calculator", "ok", "Solver")
    ]


def test_an_agent_working_inside_another_agents_tool_gets_its_own_name(
    example: ModuleType, agl_server: ServerProcess, agl_client: Client
) -> None:
    """What delegation does: a coworker works inside the manager's tool call; the innermost agent wins."""

    @agl.rollout
    def manager_with_an_expert(task: Any, llm: agl.LLM) -> None:
        model = LLM(model=f"openai/{llm.model}", base_url=llm.base_url, api_key=llm.api_key)
        expert = Agent(role="Expert", goal="Compute.", backstory="You compute.", tools=[example.calculator], llm=model)

        @tool("ask_expert")
        def ask_expert(expression: str) -> str:
            """Ask the expert to compute an arithmetic expression."""
            return str(expert.kickoff(f"Compute {expression}").raw)

        manager = Agent(role="Manager", goal="Answer.", backstory="You manage.", tools=[ask_expert], llm=model)
        question = Task(description="What is 6 * 7?", expected_output="a number", agent=manager)
        Crew(agents=[manager], tasks=[question]).kickoff()

    detail = run_one(manager_with_an_expert, agl_server, agl_client, "t")
    assert [c.agent_name for c in calls_of(detail)] == ["Manager", "Expert", "Expert", "Manager"]
    spans = {s.name: s for s in detail.spans}
    assert (spans["tool:ask_expert"].agent_name, spans["tool:calculator"].agent_name) == ("Manager", "Expert")
    assert spans["agent:Expert"].parent_id == spans["agent:Manager"].span_id


def test_agents_working_in_parallel_threads_keep_their_own_names(agl_server: ServerProcess, agl_client: Client) -> None:
    """Tasks with `async_execution` run at once in CrewAI's threads; a YAML-style role is tidied."""

    @agl.rollout
    def parallel_crew(task: Any, llm: agl.LLM) -> None:
        model = LLM(model=f"openai/{llm.model}", base_url=llm.base_url, api_key=llm.api_key)
        experts = [
            Agent(role=role, goal="Take notes.", backstory="You are an expert.", llm=model)
            for role in ("Historian", "Geographer", "Economist")
        ]
        editor = Agent(role="Chief\n  Editor\n", goal="Merge notes.", backstory="You edit.", llm=model)
        tasks = [
            Task(description="Take notes", expected_output="notes", agent=a, async_execution=True) for a in experts
        ]
        tasks.append(Task(description="Merge the notes", expected_output="one text", agent=editor, context=tasks))
        Crew(agents=[*experts, editor], tasks=tasks).kickoff()

    detail = run_one(parallel_crew, agl_server, agl_client, "t")
    calls = calls_of(detail)
    assert sorted(c.agent_name or "" for c in calls) == ["Chief Editor", "Economist", "Geographer", "Historian"]
    for call in calls:  # each request came from the agent whose name it carries
        system_prompt = " ".join(str(call.request["messages"][0]["content"]).split())
        assert system_prompt.startswith(f"You are {call.agent_name}"), (call.agent_name, system_prompt)


def test_a_role_that_cannot_travel_in_a_header_is_left_unattributed(
    agl_server: ServerProcess, agl_client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    @agl.rollout
    def crew_with_accented_role(task: Any, llm: agl.LLM) -> None:
        model = LLM(model=f"openai/{llm.model}", base_url=llm.base_url, api_key=llm.api_key)
        agent = Agent(role="Rédacteur", goal="Write.", backstory="You write.", llm=model)
        Crew(agents=[agent], tasks=[Task(description="Write", expected_output="text", agent=agent)]).kickoff()

    detail = run_one(crew_with_accented_role, agl_server, agl_client, "t")
    assert [(c.agent_name, c.attribution.value) for c in detail.llm_calls] == [(None, "unattributed")]
    assert "Rédacteur" in caplog.text


def test_listener_is_the_crewai_style_entry_point(instrumented: AglListener) -> None:
    assert AglListener() is instrumented and instrumented.listening
