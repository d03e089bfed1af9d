"""The example team (RoundRobinGroupChat of solver + verifier) and a SelectorGroupChat, run by a real agl runner
against a real `agl serve` and the scripted upstream: each stored LLM call must carry the name of the AutoGen
agent that made it, tool calls must be spans with ok / error, and selection must keep only chosen agents."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.base import TaskResult
from autogen_agentchat.conditions import MaxMessageTermination, TextMentionTermination
from autogen_agentchat.messages import BaseChatMessage
from autogen_agentchat.teams import SelectorGroupChat
from autogen_ext.models.openai import OpenAIChatCompletionClient

import agl
from agl.learn.selection import AgentSelection
from agl.learn.transitions import build_episodes
from agl.schema import RolloutDetail, Span

# The scripted model follows `agl-tools:` / `agl-say:` lines in an agent's system message (see
# agl.testing.upstream); the example's own instructions stay in front of them.
SOLVER_SCRIPT = "\nagl-tools: calculator\nagl-say: The answer is {tool}."
VERIFIER_SCRIPT = "\nagl-say: APPROVE, that is right."


def scripted_task(example: ModuleType, question: str, answer: float) -> dict[str, Any]:
    return {
        "question": question,
        "answer": answer,
        "solver_prompt": example.SOLVER_PROMPT + SOLVER_SCRIPT,
        "verifier_prompt": example.VERIFIER_PROMPT + VERIFIER_SCRIPT,
    }


def spans_named(detail: RolloutDetail, prefix: str) -> list[Span]:
    return sorted((s for s in detail.spans if s.name.startswith(prefix)), key=lambda s: s.start_time)


def assert_team_run_attributed(detail: RolloutDetail, *, stream: bool) -> None:
    calls = detail.llm_calls
    # solver: tool call, then the answer after reading the tool result; verifier: APPROVE.
    assert [c.agent_name for c in calls] == ["solver", "solver", "verifier"]
    assert all(c.attribution.value == "scope" for c in calls)
    assert all(c.stream is stream for c in calls)
    assert calls[0].response_message is not None and calls[0].response_message["tool_calls"]
    assert [s.name for s in spans_named(detail, "agent:")] == ["agent:solver", "agent:verifier"]
    # each call hangs under its own agent's span
    agent_span = {s.span_id: s.agent_name for s in spans_named(detail, "agent:")}
    assert [agent_span.get(c.parent_span_id or "") for c in calls] == ["solver", "solver", "verifier"]
    (tool,) = spans_named(detail, "tool:")
    assert tool.name == "tool:calculator" and tool.status.value == "ok" and tool.agent_name == "solver"
    assert tool.attributes["agl.tool.result"] == "42"
    assert tool.attributes["agl.tool.arguments"] == '{"expression":"12+30"}'
    assert tool.parent_id == next(s.span_id for s in spans_named(detail, "agent:solver"))
    assert [r.value for r in detail.rewards if r.name == "final"] == [1.0]


def test_sync_rollout_runs_team_in_its_own_loop(example: ModuleType, run_rollout: Any) -> None:
    detail = run_rollout(example.solve, scripted_task(example, "What is 12+30?", 42))
    assert_team_run_attributed(detail, stream=False)


def test_async_rollout(example: ModuleType, run_rollout: Any) -> None:
    detail = run_rollout(example.solve_async, scripted_task(example, "What is 12+30?", 42))
    assert_team_run_attributed(detail, stream=False)


def test_streaming_run_stream_and_model_client_stream(example: ModuleType, run_rollout: Any) -> None:
    detail = run_rollout(example.solve_streaming, scripted_task(example, "What is 12+30?", 42))
    assert_team_run_attributed(detail, stream=True)


@pytest.mark.parametrize("app", ["solve", "solve_streaming"])
def test_failing_tool_is_an_error_span(example: ModuleType, run_rollout: Any, app: str) -> None:
    # AutoGen catches the tool's exception and hands the model an error result; it must still be an error span.
    detail = run_rollout(getattr(example, app), scripted_task(example, "What is 7/0?", 0))
    (tool,) = spans_named(detail, "tool:")
    assert tool.status.value == "error" and tool.agent_name == "solver"
    assert "division by zero" in (tool.status_message or "")
    assert tool.attributes["agl.tool.arguments"] == '{"expression":"7/0"}'
    assert [c.agent_name for c in detail.llm_calls] == ["solver", "solver", "verifier"]
    assert [r.value for r in detail.rewards if r.name == "final"] == [0.0]


def test_selection_trains_only_the_chosen_agent(example: ModuleType, run_rollout: Any) -> None:
    detail = run_rollout(example.solve_async, scripted_task(example, "What is 12+30?", 42))
    assert {c.agent_name for c in detail.llm_calls} == {"solver", "verifier"}  # both stored

    episodes, _ = build_episodes([detail], AgentSelection.parse("solver"))
    assert [t.agent_name for ep in episodes for t in ep.transitions] == ["solver", "solver"]

    episodes, _ = build_episodes([detail], AgentSelection.parse("verifier"))
    assert [t.agent_name for ep in episodes for t in ep.transitions] == ["verifier"]

    episodes, _ = build_episodes([detail], AgentSelection.parse(None))
    assert sorted(t.agent_name or "" for ep in episodes for t in ep.transitions) == ["solver", "solver", "verifier"]


SELECTOR_PROMPT = "agl-say: solver\nPick who speaks next from {participants}.\n{roles}\n\n{history}"


@agl.rollout
async def selector_team(task: dict[str, Any], llm: agl.LLM) -> float:
    """SelectorGroupChat: the manager asks the model who speaks; its calls run under the manager's name."""

    def client(family: str) -> OpenAIChatCompletionClient:
        info = {"vision": False, "function_calling": True, "json_output": False, "structured_output": False}
        return OpenAIChatCompletionClient(
            model=llm.model, base_url=llm.base_url, api_key=llm.api_key, model_info={**info, "family": family}
        )

    from agl_autogen_example_calculator_team import calculator  # loaded by the `example` fixture

    agents_client = client("unknown")
    selector_client = client("gpt-4o")  # an OpenAI family puts the selector prompt in a system message
    solver = AssistantAgent(
        "solver", agents_client, tools=[calculator], system_message="Solve." + SOLVER_SCRIPT, reflect_on_tool_use=True
    )
    verifier = AssistantAgent("verifier", agents_client, system_message="Check." + VERIFIER_SCRIPT)
    team = SelectorGroupChat(
        [solver, verifier],
        model_client=selector_client,
        selector_prompt=SELECTOR_PROMPT,
        model_client_streaming=task["stream"],
        termination_condition=TextMentionTermination("APPROVE") | MaxMessageTermination(5),
    )
    try:
        result = await team.run(task="What is 12+30?")
    finally:
        await agents_client.close()
        await selector_client.close()
    assert isinstance(result, TaskResult)
    said = [m.source for m in result.messages if isinstance(m, BaseChatMessage)]
    assert said == ["user", "solver", "verifier"], said
    return 1.0


@pytest.mark.parametrize("stream", [False, True])
def test_selector_calls_are_the_managers(example: ModuleType, run_rollout: Any, stream: bool) -> None:
    detail = run_rollout(selector_team, {"stream": stream})
    calls = detail.llm_calls
    # The first pick needs the model; after solver spoke, verifier is the only other candidate (no call).
    assert [c.agent_name for c in calls] == ["SelectorGroupChatManager", "solver", "solver", "verifier"]
    assert all(c.attribution.value == "scope" for c in calls)
    assert calls[0].stream is stream
    assert "Pick who speaks next" in str(calls[0].request["messages"])
    assert [s.name for s in spans_named(detail, "agent:")] == ["agent:solver", "agent:verifier"]
    episodes, _ = build_episodes([detail], AgentSelection.parse("SelectorGroupChatManager"))
    assert [t.agent_name for ep in episodes for t in ep.transitions] == ["SelectorGroupChatManager"]
