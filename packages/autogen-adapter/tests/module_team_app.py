"""An AgentChat app as AutoGen's guides write it: the model client, the agent and the team built once, at import
time. A team object is one conversation: rollouts that run it at the same time make AgentChat refuse."""

from __future__ import annotations

from typing import Any

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_ext.models.openai import OpenAIChatCompletionClient

import agl
import agl_autogen

agl_autogen.instrument()

CLIENT = OpenAIChatCompletionClient(model="gpt-4o")  # reads OPENAI_BASE_URL, which `agl worker` points at agl
TEAM = RoundRobinGroupChat(
    [AssistantAgent("helper", model_client=CLIENT)], termination_condition=MaxMessageTermination(2)
)


@agl.rollout
async def answer(task: dict[str, Any], llm: agl.LLM) -> float:
    await TEAM.reset()
    result = await TEAM.run(task=task["question"])
    return 1.0 if result.messages else 0.0
