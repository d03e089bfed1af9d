"""The real SDK against a real `agl serve` and the scripted upstream: who made each LLM call, what the tools did.

The agent a stored call really came from is read from its request (`sent_by`) and compared with the name agl
stored for it.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, cast

import openai
from agents import Agent, FunctionTool, OpenAIChatCompletionsModel, RunConfig, Runner, function_tool
from agents.tool import default_tool_error_function
from openai import AsyncOpenAI

import agl
import agl_openai_agents
from agl.client import Client
from agl.common.processes import ServerProcess
from agl.learn.selection import AgentSelection
from agl.learn.transitions import build_episodes
from agl.schema import RolloutDetail
from openai_agents_support import SCRIPTED, TASK, final_reward, load_example, run_one, sent_by, spans_named

example = load_example()


def assert_triage_then_math(detail: RolloutDetail) -> None:
    calls = detail.llm_calls
    assert [c.agent_name for c in calls] == ["triage", "triage", "math", "math"]
    assert all(c.attribution.value == "scope" and c.agent_name == sent_by(c) for c in calls)
    assert final_reward(detail) == 1.0


@agl.rollout
def solve_sync(task: dict[str, Any], llm: agl.LLM) -> float:
    agl_openai_agents.instrument()
    model = OpenAIChatCompletionsModel(model=llm.model, openai_client=AsyncOpenAI(base_url=llm.base_url, api_key="k"))
    result = Runner.run_sync(
        example.build_agents(task["instructions"]), task["question"], run_config=RunConfig(model=model)
    )
    return float(example.reward(result.final_output, task["answer"]))


@agl.rollout
async def solve_streamed(task: dict[str, Any], llm: agl.LLM) -> float:
    agl_openai_agents.instrument()
    async with AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key) as client:
        model = OpenAIChatCompletionsModel(model=llm.model, openai_client=client)
        result = Runner.run_streamed(
            example.build_agents(task["instructions"]), task["question"], run_config=RunConfig(model=model)
        )
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


def test_a_failing_tool_is_an_error_span_with_its_reason_though_the_sdk_hands_the_model_a_message(
    agl_server: ServerProcess, agl_client: Client
) -> None:
    task = {**TASK, "question": "What is 7 / 0?", "answer": 0}
    detail = run_one(example.solve, agl_server, agl_client, task)
    calc = detail.llm_calls[-1]
    # The SDK caught the exception and sent the model its own message, exactly as without agl: its default
    # formatter's (with the reason in openai-agents 0.20, a fixed text since 0.21).
    sdk_message = default_tool_error_function(cast(Any, None), ValueError("division by zero"))
    assert calc.request["messages"][-1]["content"] == sdk_message
    # ...and agl records the call as failed, with the real reason (not the SDK's redacted span text).
    by_name = {s.name: s for s in spans_named(detail, "tool:")}
    assert by_name["tool:classify"].status.value == "ok"
    failed = by_name["tool:calculator"]
    assert failed.status.value == "error" and failed.agent_name == "math"
    assert failed.status_message is not None and "ValueError: division by zero" in failed.status_message
    assert final_reward(detail) == 0.0


@agl.rollout
async def failing_tools(task: dict[str, Any], llm: agl.LLM) -> None:
    """Lone agents run at once, each calling a tool that fails with a message of its own: async tools that all
    wait until every one of them has started (so their failures really overlap), and a sync tool (the SDK runs
    it in a thread) with its own `failure_error_function`."""
    agl_openai_agents.instrument()
    names: list[str] = task["async"]
    started: list[str] = []
    all_started = asyncio.Event()

    @function_tool
    async def explode(what: str) -> str:
        """Explode."""
        started.append(what)
        if len(started) == len(names):
            all_started.set()
        await asyncio.wait_for(all_started.wait(), timeout=10)
        raise RuntimeError(f"{what} blew up")

    @function_tool(failure_error_function=lambda ctx, error: "Not now.")
    def explode_in_thread(what: str) -> str:
        """Explode in a thread."""
        raise LookupError(f"{what} not found")

    def lone(name: str, tool: FunctionTool) -> Agent[Any]:
        return Agent(name=name, instructions=f"You are {name}.\nagl-tools: {tool.name}", tools=[tool])

    async with AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key) as client:
        config = RunConfig(model=OpenAIChatCompletionsModel(model=llm.model, openai_client=client))
        runs = [Runner.run(lone(name, explode), name, run_config=config) for name in names]
        runs.append(Runner.run(lone(task["sync"], explode_in_thread), task["sync"], run_config=config))
        await asyncio.gather(*runs)


def assert_each_tool_span_has_its_own_reason(detail: RolloutDetail, task: dict[str, Any]) -> None:
    tools = {s.agent_name: s for s in spans_named(detail, "tool:")}
    assert sorted(tools) == sorted([*task["async"], task["sync"]])
    for name in task["async"]:
        assert (tools[name].name, tools[name].status.value) == ("tool:explode", "error")
        assert tools[name].status_message is not None
        assert tools[name].status_message.endswith(f"RuntimeError: {name} blew up"), tools[name].status_message
    sync = tools[task["sync"]]
    assert (sync.name, sync.status.value) == ("tool:explode_in_thread", "error")
    assert sync.status_message is not None and sync.status_message.endswith(f"LookupError: {task['sync']} not found")
    # What the model was shown is the SDK's: its default message for the async tools, the app's own for the other.
    shown = {
        sent_by(c): c.request["messages"][-1]["content"] for c in detail.llm_calls if len(c.request["messages"]) > 2
    }
    for name in task["async"]:
        assert shown[name] == default_tool_error_function(cast(Any, None), RuntimeError(f"{name} blew up"))
    assert shown[task["sync"]] == "Not now."


def test_concurrent_failing_tools_each_keep_their_own_reason(agl_server: ServerProcess, agl_client: Client) -> None:
    task = {"async": ["alpha", "beta", "gamma"], "sync": "delta"}
    assert_each_tool_span_has_its_own_reason(run_one(failing_tools, agl_server, agl_client, task), task)


def test_concurrent_rollouts_each_keep_their_own_tool_failures(agl_server: ServerProcess, agl_client: Client) -> None:
    tasks = [{"async": ["alpha", "beta"], "sync": "gamma"}, {"async": ["one", "two"], "sync": "three"}]
    rollouts = [r for task in tasks for r in agl_client.enqueue(task)]
    stats = agl.Runner(failing_tools, agl_server.url, concurrency=2, heartbeat_s=0.5).run(max_rollouts=2)
    assert stats.succeeded == 2, stats
    for rollout, task in zip(rollouts, tasks, strict=True):
        assert_each_tool_span_has_its_own_reason(agl_client.rollout_detail(rollout.id), task)


@agl.rollout
async def failing_tool_without_sensitive_data(task: dict[str, Any], llm: agl.LLM) -> None:
    agl_openai_agents.instrument()
    async with AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key) as client:
        model = OpenAIChatCompletionsModel(model=llm.model, openai_client=client)
        config = RunConfig(model=model, trace_include_sensitive_data=False)
        await Runner.run(example.build_agents(SCRIPTED), "What is 7 / 0?", run_config=config)


def test_without_sensitive_trace_data_a_failed_tool_keeps_only_the_exception_type(
    agl_server: ServerProcess, agl_client: Client
) -> None:
    detail = run_one(failing_tool_without_sensitive_data, agl_server, agl_client)
    failed = {s.name: s for s in spans_named(detail, "tool:")}["tool:calculator"]
    assert failed.status.value == "error" and failed.status_message is not None
    assert failed.status_message.endswith(": ValueError") and "division" not in failed.status_message


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

        config = RunConfig(model=model)

        def lone(name: str) -> Agent[Any]:
            return Agent(name=name, instructions=f"You are {name}.\nagl-tools: classify", tools=[example.classify])

        runs = [Runner.run(example.build_agents(SCRIPTED), "What is 2 + 3?", run_config=config)]
        runs += [
            Runner.run(lone(name), f"{name}: what is {i} + 1?", run_config=config)
            for i, name in enumerate(["alpha", "beta", "gamma"])
        ]
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
    switches = sum(a != b for a, b in itertools.pairwise(names))
    assert switches > 4, names


@agl.rollout
async def agent_as_tool(task: dict[str, Any], llm: agl.LLM) -> float:
    """A `boss` agent that calls the math agent as a tool (a nested run) instead of handing off to it."""
    agl_openai_agents.instrument()
    async with AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key) as client:
        model = OpenAIChatCompletionsModel(model=llm.model, openai_client=client)
        math_agent = example.build_agents(SCRIPTED).handoffs[0]
        ask_math = math_agent.as_tool(tool_name="ask_math", tool_description="Ask the math agent.")
        boss = Agent(name="boss", instructions="You are boss.\nagl-tools: ask_math", tools=[ask_math])
        result = await Runner.run(boss, task["question"], run_config=RunConfig(model=model))
    return float(example.reward(result.final_output, task["answer"]))


def test_an_agent_called_as_a_tool_has_its_own_name_and_the_caller_gets_its_name_back(
    agl_server: ServerProcess, agl_client: Client
) -> None:
    detail = run_one(agent_as_tool, agl_server, agl_client)
    assert [c.agent_name for c in detail.llm_calls] == ["boss", "math", "math", "boss"]
    assert all(c.agent_name == sent_by(c) for c in detail.llm_calls)
    tools = [(s.name, s.status.value, s.agent_name) for s in spans_named(detail, "tool:")]
    assert sorted(tools) == [("tool:ask_math", "ok", "boss"), ("tool:calculator", "ok", "math")]
    assert final_reward(detail) == 1.0


@agl.rollout
async def failed_run_then_plain_call(task: Any, llm: agl.LLM) -> None:
    agl_openai_agents.instrument()
    async with AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0) as client:
        model = OpenAIChatCompletionsModel(model=llm.model, openai_client=client)
        try:
            await Runner.run(
                example.build_agents(SCRIPTED), "What is 1 + 1? force_error:500", run_config=RunConfig(model=model)
            )
        except openai.InternalServerError:
            pass
        else:
            raise AssertionError("the scripted upstream should have failed the call")
        assert agl.current_agent() is None  # the failed run's agent does not linger
        await client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": "plain"}])


def test_a_failed_run_leaves_no_agent_behind(agl_server: ServerProcess, agl_client: Client) -> None:
    failed, plain = run_one(failed_run_then_plain_call, agl_server, agl_client).llm_calls
    assert (failed.agent_name, failed.status) == ("triage", "error")
    assert (plain.agent_name, plain.attribution.value) == (None, "unattributed")


@agl.rollout
async def tool_that_calls_the_llm(task: Any, llm: agl.LLM) -> None:
    """A sync tool (the SDK runs it in a thread) whose own code asks the LLM: the call is part of the agent's turn."""
    agl_openai_agents.instrument()

    @function_tool
    def second_opinion(question: str) -> str:
        """Ask another model."""
        helper = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
        reply = helper.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": question}])
        return reply.choices[0].message.content or ""

    async with AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key) as client:
        writer = Agent(name="writer", instructions="You are writer.\nagl-tools: second_opinion", tools=[second_opinion])
        model = OpenAIChatCompletionsModel(model=llm.model, openai_client=client)
        result = await Runner.run(writer, "is 2 + 2 = 4?", run_config=RunConfig(model=model))
    assert result.final_output == "The answer is Echo: is 2 + 2 = 4?"


def test_llm_calls_inside_a_tool_carry_the_calling_agents_name(agl_server: ServerProcess, agl_client: Client) -> None:
    calls = run_one(tool_that_calls_the_llm, agl_server, agl_client).llm_calls
    assert [c.agent_name for c in calls] == ["writer", "writer", "writer"]
    assert [c.request["messages"][0]["role"] for c in calls] == ["system", "user", "system"]  # the middle: the tool's
