"""A Google ADK app with two agents: a planner that uses a solver agent as a tool (`AgentTool`), and the
solver's calculator tool, which fails on a division by zero. ADK emits its own OpenTelemetry spans in the GenAI
semantic conventions (`invoke_agent planner`, `execute_tool calculator`); agl_otel reads them. ADK reaches an
OpenAI-compatible server through LiteLLM (`LiteLlm("openai/...")`), which sends through the OpenAI SDK.

    agl worker packages/otel-adapter/examples/google_adk_agent_tool.py:solve

The app itself is unchanged: LiteLLM reads OPENAI_BASE_URL / OPENAI_API_KEY, which `agl worker` points at the
run. The lines agl needs are marked `# agl`.
"""

from __future__ import annotations

import re
from typing import Any

from google.adk.agents import LlmAgent
from google.adk.models.lite_llm import LiteLlm
from google.adk.runners import InMemoryRunner
from google.adk.tools.agent_tool import AgentTool
from google.genai import types

import agl  # agl
import agl_otel  # agl


def calculator(expression: str) -> str:
    """Evaluate `<int> <op> <int>`, with op one of + - * /.

    Args:
        expression: the expression to evaluate.
    """
    found = re.fullmatch(r"\s*(-?\d+)\s*([+\-*/])\s*(-?\d+)\s*", expression)
    if found is None:
        raise ValueError(f"not an expression: {expression!r}")
    a, op, b = int(found[1]), found[2], int(found[3])
    return str({"+": a + b, "-": a - b, "*": a * b, "/": a / b if op == "/" else 0}[op])


def build() -> LlmAgent:
    # the scripted test backend reads `agl-tools:` to know which tool to call; a real model reads instructions
    model = LiteLlm(model="openai/gpt-4o-mini")
    solver = LlmAgent(
        name="solver",
        model=model,
        description="Solves one arithmetic question.",
        instruction="You are solver.\nagl-tools: calculator",
        tools=[calculator],
    )
    return LlmAgent(
        name="planner", model=model, instruction="You are planner.\nagl-tools: solver", tools=[AgentTool(agent=solver)]
    )


async def main(question: str) -> str:
    runner = InMemoryRunner(agent=build(), app_name="calc")
    session = await runner.session_service.create_session(app_name="calc", user_id="user")
    answer = ""
    message = types.Content(role="user", parts=[types.Part(text=question)])
    async for event in runner.run_async(user_id="user", session_id=session.id, new_message=message):
        if event.is_final_response() and event.content and event.content.parts:
            answer = "".join(part.text or "" for part in event.content.parts)
    return answer


@agl.rollout  # agl
async def solve(task: dict[str, Any], llm: agl.LLM) -> float:  # agl
    agl_otel.instrument()  # agl
    numbers = re.findall(r"-?\d+(?:\.\d+)?", await main(task["question"]))  # agl
    return float(bool(numbers) and float(numbers[-1]) == float(task["answer"]))  # agl
