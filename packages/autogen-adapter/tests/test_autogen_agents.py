"""Agents used without the example team: alone (`run`, `run_stream`, `on_messages`), concurrently, nested (an
agent used as another agent's tool), and a custom agent class written after `instrument()`."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import pytest
from autogen_agentchat.agents import AssistantAgent, BaseChatAgent
from autogen_agentchat.base import Response
from autogen_agentchat.messages import BaseChatMessage, TextMessage
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_agentchat.tools import AgentTool
from autogen_core import CancellationToken
from autogen_core.models import UserMessage
from autogen_ext.models.openai import OpenAIChatCompletionClient

import agl
from agl.schema import LLMCall

MODEL_INFO = {"vision": False, "function_calling": True, "json_output": False, "structured_output": False}


def model_client(llm: agl.LLM) -> OpenAIChatCompletionClient:
    return OpenAIChatCompletionClient(
        model=llm.model, base_url=llm.base_url, api_key=llm.api_key, model_info={**MODEL_INFO, "family": "unknown"}
    )


def said_by(call: LLMCall) -> str:
    """The agent a call claims to come from: each test agent puts its own name in front of its task."""
    return str(call.request["messages"][-1]["content"]).split(":")[0]  # type: ignore[index,call-overload]


@agl.rollout
async def lone_agents(task: Any, llm: agl.LLM) -> None:
    client = model_client(llm)
    one = AssistantAgent("one", client)
    two = AssistantAgent("two", client, model_client_stream=True)
    three = AssistantAgent("three", client)
    await one.run(task="one: hello")
    async for _ in two.run_stream(task="two: hello"):
        pass
    await three.on_messages([TextMessage(content="three: hello", source="user")], CancellationToken())
    await client.close()


def test_agent_alone_run_run_stream_on_messages(run_rollout: Any) -> None:
    detail = run_rollout(lone_agents, "t")
    assert [(c.agent_name, c.attribution.value, c.stream) for c in detail.llm_calls] == [
        ("one", "scope", False),
        ("two", "scope", True),
        ("three", "scope", False),
    ]
    assert sorted(s.name for s in detail.spans) == ["agent:one", "agent:three", "agent:two"]


@agl.rollout
async def concurrent_agents(task: Any, llm: agl.LLM) -> None:
    client = model_client(llm)
    names = ["alpha", "beta", "gamma"]
    agents = [AssistantAgent(n, client, model_client_stream=(n != "beta")) for n in names]

    async def talk(agent: AssistantAgent) -> None:
        for turn in range(3):
            async for _ in agent.run_stream(task=f"{agent.name}: turn {turn}"):
                await asyncio.sleep(0)  # let the other agents' steps run between this one's

    await asyncio.gather(*(talk(a) for a in agents))
    await client.close()


def test_concurrent_agents_keep_their_own_names(run_rollout: Any) -> None:
    calls = run_rollout(concurrent_agents, "t").llm_calls
    assert len(calls) == 9
    assert [c.agent_name for c in calls] == [said_by(c) for c in calls]
    assert sorted(c.agent_name or "" for c in calls) == ["alpha"] * 3 + ["beta"] * 3 + ["gamma"] * 3


@agl.rollout
async def who_sees_the_name(task: Any, llm: agl.LLM) -> None:
    client = model_client(llm)
    seen_by_tool: list[str | None] = []

    async def lookup(query: str) -> str:
        """Look something up."""
        seen_by_tool.append(agl.current_agent())
        return "found"

    solver = AssistantAgent("solver", client, tools=[lookup], system_message="agl-tools: lookup\nagl-say: ok {tool}")
    checker = AssistantAgent("checker", client, system_message="agl-say: fine")
    team = RoundRobinGroupChat([solver, checker], max_turns=2)
    seen_by_consumer = []
    with agl.agent("app"):
        async for _ in team.run_stream(task="find it"):
            seen_by_consumer.append(agl.current_agent())
    await client.close()
    assert seen_by_tool == ["solver"], seen_by_tool
    # The code that reads the team's stream keeps its own scope between the agents' steps.
    assert seen_by_consumer and set(seen_by_consumer) == {"app"}, seen_by_consumer


def test_agent_name_is_inside_the_turn_only(run_rollout: Any) -> None:
    detail = run_rollout(who_sees_the_name, "t")
    assert [c.agent_name for c in detail.llm_calls] == ["solver", "checker"]


@agl.rollout
async def nested_agents(task: Any, llm: agl.LLM) -> None:
    from agl_autogen_example_calculator_team import calculator  # loaded by the `example` fixture

    client = model_client(llm)
    solver = AssistantAgent(
        "solver", client, tools=[calculator], system_message="agl-tools: calculator\nagl-say: It is {tool}."
    )
    planner = AssistantAgent(
        "planner",
        client,
        tools=[AgentTool(solver)],
        system_message="agl-tools: solver\nagl-say: Solved: {tool}",
        reflect_on_tool_use=True,
    )
    await planner.run(task="What is 6*7?")
    await client.close()


def test_agent_used_as_a_tool_gets_its_own_name(example: ModuleType, run_rollout: Any) -> None:
    detail = run_rollout(nested_agents, "t")
    assert [c.agent_name for c in detail.llm_calls] == ["planner", "solver", "planner"]
    assert sorted(s.name for s in detail.spans) == ["agent:planner", "agent:solver", "tool:calculator", "tool:solver"]
    spans = {s.name: s for s in detail.spans}
    assert spans["tool:calculator"].agent_name == "solver" and spans["tool:calculator"].status.value == "ok"
    assert spans["tool:solver"].agent_name == "planner" and spans["tool:solver"].status.value == "ok"
    # the inner agent's span sits under the outer agent's span, which the tool span also hangs from
    assert spans["agent:solver"].parent_id == spans["agent:planner"].span_id == spans["tool:solver"].parent_id


@agl.rollout
async def custom_agent(task: Any, llm: agl.LLM) -> None:
    class Summarizer(BaseChatAgent):  # defined after instrument(): patched as the class is created
        def __init__(self, name: str, client: OpenAIChatCompletionClient) -> None:
            super().__init__(name, "summarizes")
            self._client = client

        @property
        def produced_message_types(self) -> Sequence[type[BaseChatMessage]]:
            return (TextMessage,)

        async def on_messages(
            self, messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken
        ) -> Response:
            text = "\n".join(m.to_text() for m in messages)
            result = await self._client.create([UserMessage(content=text, source="user")])
            return Response(chat_message=TextMessage(content=str(result.content), source=self.name))

        async def on_reset(self, cancellation_token: CancellationToken) -> None:
            pass

    client = model_client(llm)
    await Summarizer("summarizer", client).run(task="summarizer: the text")
    async for _ in Summarizer("streamer", client).run_stream(task="streamer: the text"):
        pass  # the inherited on_messages_stream drives on_messages: one scope, one span
    await client.close()


def test_custom_agent_class_defined_after_instrument(run_rollout: Any) -> None:
    detail = run_rollout(custom_agent, "t")
    assert [c.agent_name for c in detail.llm_calls] == ["summarizer", "streamer"]
    assert sorted(s.name for s in detail.spans) == ["agent:streamer", "agent:summarizer"]


@agl.rollout
async def failing_agent(task: Any, llm: agl.LLM) -> None:
    client = OpenAIChatCompletionClient(
        model=llm.model,
        base_url=llm.base_url,
        api_key=llm.api_key,
        model_info={**MODEL_INFO, "family": "unknown"},
        max_retries=0,
    )
    try:
        await AssistantAgent("boom", client).run(task="force_error:500")
    except Exception as exc:  # the model's HTTP error reaches the caller through the agent
        assert "500" in str(exc), exc
    else:
        raise AssertionError("the agent should have failed")
    await client.close()


def test_failed_turn_ends_its_agent_span_in_error(run_rollout: Any) -> None:
    detail = run_rollout(failing_agent, "t")
    (call,) = detail.llm_calls
    assert (call.agent_name, call.status, call.http_status) == ("boom", "error", 500)
    (span,) = detail.spans
    assert span.name == "agent:boom" and span.status.value == "error"
    assert "500" in (span.status_message or "")


@agl.rollout
async def code_runner(task: Any, llm: agl.LLM) -> None:
    from autogen_agentchat.agents import CodeExecutorAgent
    from autogen_ext.code_executors.local import LocalCommandLineCodeExecutor
    from autogen_ext.models.replay import ReplayChatCompletionClient

    # The scripted upstream cannot write multi-line code blocks; AutoGen's own replay client can (it makes no
    # HTTP call, so only the code-execution spans are under test here).
    for name, code in (("coder", "print(6 * 7)"), ("crasher", "raise SystemExit(3)")):
        model = ReplayChatCompletionClient([f"```python\n{code}\n```", "Done."])
        executor = LocalCommandLineCodeExecutor(work_dir=task["work_dir"])
        await CodeExecutorAgent(name, code_executor=executor, model_client=model).run(task="Compute 6*7 in Python.")


@pytest.mark.filterwarnings("ignore:.*(LocalCommandLineCodeExecutor|approval function).*:UserWarning")
def test_code_execution_is_a_tool_span(run_rollout: Any, tmp_path: Any) -> None:
    detail = run_rollout(code_runner, {"work_dir": str(tmp_path)})
    runs = {s.agent_name: s for s in detail.spans if s.name == "tool:code_execution"}
    assert runs["coder"].status.value == "ok" and runs["coder"].attributes["agl.tool.result"].strip() == "42"
    assert runs["coder"].attributes["agl.tool.arguments"].strip() == "print(6 * 7)"
    assert runs["crasher"].status.value == "error" and "exit code 3" in (runs["crasher"].status_message or "")


@agl.rollout
async def society_and_swarm(task: Any, llm: agl.LLM) -> None:
    from autogen_agentchat.agents import SocietyOfMindAgent
    from autogen_agentchat.conditions import TextMentionTermination
    from autogen_agentchat.teams import Swarm

    client = model_client(llm)
    # SocietyOfMindAgent: an inner team, then the society's own call that writes the answer.
    writer = AssistantAgent("writer", client, system_message="agl-say: draft")
    editor = AssistantAgent("editor", client, system_message="agl-say: edited")
    inner = RoundRobinGroupChat([writer, editor], max_turns=2)
    await SocietyOfMindAgent("society", team=inner, model_client=client).run(task="write it")
    # Swarm: the first agent hands off to the second with a tool call.
    router = AssistantAgent("router", client, handoffs=["expert"], system_message="agl-tools: transfer_to_expert")
    expert = AssistantAgent("expert", client, system_message="agl-say: DONE")
    await Swarm([router, expert], termination_condition=TextMentionTermination("DONE")).run(task="route it")
    await client.close()


def test_society_of_mind_and_swarm(run_rollout: Any) -> None:
    detail = run_rollout(society_and_swarm, "t")
    assert [c.agent_name for c in detail.llm_calls] == ["writer", "editor", "society", "router", "expert"]
    (handoff,) = [s for s in detail.spans if s.name.startswith("tool:")]
    assert (handoff.name, handoff.agent_name, handoff.status.value) == ("tool:transfer_to_expert", "router", "ok")
