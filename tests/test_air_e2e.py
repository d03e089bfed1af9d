"""AIR end to end: a tool that fails inside a real rollout (real server, proxy, runner) becomes an automatic
reward placed after the call that asked for the tool, stored once however often it is sent."""

from __future__ import annotations

import json
from typing import Any

import openai

import agl
from agl.client import Client
from agl.common.processes import ServerProcess
from agl.learn.air import air_rewards, with_air
from agl.learn.transitions import build_episode
from tests.e2e_agents import CALCULATOR


@agl.rollout
def clumsy_agent(task: Any, llm: agl.LLM) -> float:
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "What is 12+30?"}]
    with agl.agent("planner"):
        first = client.chat.completions.create(model=llm.model, messages=messages, tools=[CALCULATOR])
    (call,) = first.choices[0].message.tool_calls or []
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    try:
        with agl.tool("calculator", call_id=call.id, arguments=call.function.arguments):
            raise ZeroDivisionError(f"cannot evaluate {json.loads(call.function.arguments)['expression']}")
    except ZeroDivisionError as exc:
        result = f"error: {exc}"
    messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    with agl.agent("planner"):
        client.chat.completions.create(model=llm.model, messages=messages)
    return 0.0


def test_failed_tool_becomes_an_automatic_reward_after_the_asking_call(server: ServerProcess, client: Client) -> None:
    (rollout,) = client.enqueue("t")
    assert agl.Runner(clumsy_agent, server.url, concurrency=1).run(max_rollouts=1).succeeded == 1
    detail = client.rollout_detail(rollout.id)
    (tool_span,) = [s for s in detail.spans if s.name == "tool:calculator"]
    assert tool_span.status.value == "error" and "ZeroDivisionError" in (tool_span.status_message or "")

    (reward,) = air_rewards(detail)
    assert (reward.value, reward.after_llm_seq, reward.source.value) == (-0.1, 0, "automatic")
    client.add_rewards([reward])
    client.add_rewards([reward])  # sent again (a trainer restarted): the uid keeps it single
    stored = [r for r in client.rollout_detail(rollout.id).rewards if r.source.value == "automatic"]
    assert [(r.name, r.after_llm_seq, r.span_id) for r in stored] == [("air:tool_status", 0, tool_span.span_id)]

    episode = build_episode(with_air(client.rollout_detail(rollout.id)))
    assert episode is not None
    assert [t.reward for t in episode.transitions] == [-0.1, 0.0]  # the final reward 0.0 on the answer
