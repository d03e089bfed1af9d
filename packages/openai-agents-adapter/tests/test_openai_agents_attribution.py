"""The real SDK against a real `agl serve` and the scripted upstream: who made each LLM call, what the tools did.

Every agent's instructions start with `You are <name>.`, so the agent a stored call really came from can be read
from its request and compared with the name agl stored for it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agents import Agent, OpenAIChatCompletionsModel, Runner
from conftest import load_example
from openai import AsyncOpenAI

import agl
import agl_openai_agents
from agl.client import Client
from agl.processes import ServerProcess
from agl.schema import LLMCall, RolloutDetail, Span
from agl.selection import AgentSelection
from agl.transitions import build_episodes

example = load_example()

# The scripted upstream calls the tools an `agl-tools:` line names, in order, then answers "The answer is X".
SCRIPTED = {
    "triage": "You are triage.\nagl-tools: classify, transfer_to_math",
    "math": "You are math.\nagl-tools: calculator",
}
TASK = {"question": "What is 12 * 7?", "answer": 84, "instructions": SCRIPTED}


def run_one(app: Any, server: ServerProcess, client: Client, task: Any = TASK) -> RolloutDetail:
    (rollout,) = client.enqueue(task)
    stats = agl.Runner(app, server.url, concurrency=1, heartbeat_s=0.5).run(max_rollouts=1)
    assert stats.succeeded == 1, stats
    detail = client.rollout_detail(rollout.id)
    detail.llm_calls.sort(key=lambda c: c.seq)
    return detail


def sent_by(call: LLMCall) -> str:
    """The agent whose instructions the request carries (its system message starts `You are <name>.`)."""
    system = call.request["messages"][0]
    assert system["role"] == "system"
    return str(system["content"]).split(".")[0].removeprefix("You are ")


def spans_named(detail: RolloutDetail, prefix: str) -> list[Span]:
    return sorted((s for s in detail.spans if s.name.startswith(prefix)), key=lambda s: s.start_time)


def final_reward(detail: RolloutDetail) -> float:
    (final,) = [r for r in detail.rewards if r.source.value == "returned"]
    return final.value


def assert_triage_then_math(detail: RolloutDetail) -> None:
    calls = detail.llm_calls
    assert [c.agent_name for c in calls] == ["triage", "triage", "math", "math"]
    assert all(c.attribution.value == "scope" and c.agent_name == sent_by(c) for c in calls)
    assert final_reward(detail) == 1.0


@agl.rollout
def solve_sync(task: dict[str, Any], llm: agl.LLM) -> float:
    agl_openai_agents.instrument()
    model = OpenAIChatCompletionsModel(model=llm.model, openai_client=AsyncOpenAI(base_url=llm.base_url, api_key="k"))
    result = Runner.run_sync(example.build_agents(model, task["instructions"]), task["question"])
    return float(example.reward(result.final_output, task["answer"]))


@agl.rollout
async def solve_streamed(task: dict[str, Any], llm: agl.LLM) -> float:
    agl_openai_agents.instrument()
    async with AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key) as client:
        model = OpenAIChatCompletionsModel(model=llm.model, openai_client=client)
        result = Runner.run_streamed(example.build_agents(model, task["instructions"]), task["question"])
        deltas = [e async for e in result.stream_events() if e.type == "raw_response_event"]
    assert deltas  # it really streamed
    return float(example.reward(result.final_output, task["answer"]))


def test_async_run_names_each_call_after_its_agent_across_the_handoff(
    agl_server: ServerProcess, agl_client: Client
) -> None:
    detail = run_one(example.solve, agl_server, agl_client)
    assert_triage_then_math(detail)


def test_run_sync_names_each_call_after_its_agent(agl_server: ServerProcess, agl_client: Client) -> None:
    assert_triage_then_math(run_one(solve_sync, agl_server, agl_client))


def test_run_streamed_names_each_call_after_its_agent(agl_server: ServerProcess, agl_client: Client) -> None:
    detail = run_one(solve_streamed, agl_server, agl_client)
    assert_triage_then_math(detail)
    assert all(c.stream for c in detail.llm_calls)


def test_tools_handoff_and_agents_become_spans(agl_server: ServerProcess, agl_client: Client) -> None:
    detail = run_one(example.solve, agl_server, agl_client)
    tools = spans_named(detail, "tool:")
    assert [(s.name, s.status.value, s.agent_name) for s in tools] == [
        ("tool:classify", "ok", "triage"),
        ("tool:calculator", "ok", "math"),
    ]
    calc = tools[1].attributes
    assert (calc["agl.tool.arguments"], calc["agl.tool.result"]) == ('{"expression":"12*7"}', "84")
    (handoff,) = spans_named(detail, "handoff:")
    assert (handoff.name, handoff.status.value, handoff.agent_name) == ("handoff:triage->math", "ok", "triage")
    agents = spans_named(detail, "agent:")
    assert [(s.name, s.agent_name) for s in agents] == [("agent:triage", "triage"), ("agent:math", "math")]


def test_a_failing_tool_is_an_error_span_though_the_sdk_hands_the_model_a_message(
    agl_server: ServerProcess, agl_client: Client
) -> None:
    task = {**TASK, "question": "What is 7 / 0?", "answer": 0}
    detail = run_one(example.solve, agl_server, agl_client, task)
    calc = detail.llm_calls[-1]
    # The SDK caught the exception and sent its message to the model as the tool's output...
    assert "division by zero" in calc.request["messages"][-1]["content"]
    # ...and agl still records the call as failed, with the reason.
    by_name = {s.name: s for s in spans_named(detail, "tool:")}
    assert by_name["tool:classify"].status.value == "ok"
    failed = by_name["tool:calculator"]
    assert failed.status.value == "error" and failed.agent_name == "math"
    assert failed.status_message is not None and "division by zero" in failed.status_message
    assert final_reward(detail) == 0.0


def test_selecting_math_trains_only_math_while_triage_calls_stay_stored(
    agl_server: ServerProcess, agl_client: Client
) -> None:
    detail = run_one(example.solve, agl_server, agl_client)
    assert [c.agent_name for c in detail.llm_calls].count("triage") == 2  # stored, with their own name

    (episode,), stats = build_episodes([detail], AgentSelection.parse("math"))
    assert [t.agent_name for t in episode.transitions] == ["math", "math"]
    assert stats.dropped_calls == {"agent not selected": 2}

    (episode,), _ = build_episodes([detail], AgentSelection.parse("triage"))
    assert [t.agent_name for t in episode.transitions] == ["triage", "triage"]
    (episode,), _ = build_episodes([detail], AgentSelection.parse("triage,math"))
    assert len(episode.transitions) == 4


@agl.rollout
async def concurrent_runs(task: Any, llm: agl.LLM) -> None:
    """Four `Runner.run`s in four asyncio tasks at once: the triage→math pipeline and three lone agents."""
    agl_openai_agents.instrument()
    async with AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key) as client:
        model = OpenAIChatCompletionsModel(model=llm.model, openai_client=client)

        def lone(name: str) -> Agent[Any]:
            return Agent(name=name, instructions=f"You are {name}.\nagl-tools: classify", tools=[example.classify], model=model)

        runs = [Runner.run(example.build_agents(model, SCRIPTED), "What is 2 + 3?")]
        runs += [Runner.run(lone(name), f"{name}: what is {i} + 1?") for i, name in enumerate(["alpha", "beta", "gamma"])]
        results = await asyncio.gather(*runs)
    assert [str(r.final_output) for r in results] == [
        "The answer is 5",
        "The answer is arithmetic",
        "The answer is arithmetic",
        "The answer is arithmetic",
    ]


def test_concurrent_runs_in_asyncio_tasks_keep_their_own_agent(agl_server: ServerProcess, agl_client: Client) -> None:
    calls = run_one(concurrent_runs, agl_server, agl_client).llm_calls
    assert len(calls) == 10
    assert all(c.agent_name == sent_by(c) for c in calls), [(c.agent_name, sent_by(c)) for c in calls]
    names = [c.agent_name for c in calls]
    # The runs really overlapped: by sequence number, calls of different agents alternate.
    switches = sum(a != b for a, b in zip(names, names[1:]))
    assert switches > 4, names
