"""An OpenAI Agents SDK app with two agents: a planner that hands each question to a solver agent exposed as its
tool (the SDK's agent-as-tool: `Agent.as_tool`), and the solver's calculator function tool, which raises on a
division by zero. `openinference-instrumentation-openai-agents` turns the SDK's traces into OpenInference spans
(kind AGENT for each agent's run, TOOL for each tool call), which agl_otel reads. (agl also has a native adapter
for this SDK, agl_openai_agents; this example is the path of an app already instrumented with OpenInference.)

    agl worker packages/otel-adapter/examples/openinference_openai_agents_as_tool.py:solve

The app itself is unchanged: its model comes from OPENAI_BASE_URL / OPENAI_API_KEY, which `agl worker` points at
the run. The lines agl needs are marked `# agl`.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool
from openai import AsyncOpenAI
from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor

import agl  # agl
import agl_otel  # agl

# once, at import: OpenInference's instrument() is not thread-safe, and a worker runs rollouts at once
OpenAIAgentsInstrumentor().instrument()  # agl: the SDK's spans, unless the app already has them on


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression of two integers.

    Args:
        expression: `<int> <op> <int>`, with op one of + - * /.
    """
    found = re.fullmatch(r"\s*(-?\d+)\s*([+\-*/])\s*(-?\d+)\s*", expression)
    if found is None:
        raise ValueError(f"not an expression: {expression!r}")
    a, op, b = int(found[1]), found[2], int(found[3])
    return str({"+": a + b, "-": a - b, "*": a * b, "/": a / b if op == "/" else 0}[op])


def build() -> Agent:
    # the scripted test backend reads `agl-tools:` to know which tool to call; a real model reads instructions.
    # Chat Completions, which any OpenAI-compatible server speaks; AsyncOpenAI reads OPENAI_BASE_URL / _API_KEY
    model = OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=AsyncOpenAI())
    solver = Agent(
        name="solver",
        instructions="You are solver.\nagl-tools: calculator",
        tools=[calculator],
        model=model,
    )
    return Agent(
        name="planner",
        instructions="You are planner.\nagl-tools: solver",
        tools=[solver.as_tool(tool_name="solver", tool_description="Ask the solver agent one arithmetic question.")],
        model=model,
    )


async def main(question: str) -> str:
    result = await Runner.run(build(), question, max_turns=4)
    return str(result.final_output)


@agl.rollout  # agl
def solve(task: dict[str, Any], llm: agl.LLM) -> float:  # agl
    agl_otel.instrument()  # agl
    numbers = re.findall(r"-?\d+(?:\.\d+)?", asyncio.run(main(task["question"])))  # agl
    return float(bool(numbers) and float(numbers[-1]) == float(task["answer"]))  # agl
