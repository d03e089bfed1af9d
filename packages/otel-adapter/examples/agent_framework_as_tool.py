"""A Microsoft Agent Framework app with two agents: a planner that uses a solver agent as a tool
(`Agent.as_tool()`), and the solver's calculator tool, which raises on a division by zero. Agent Framework emits
its own OpenTelemetry spans in the GenAI semantic conventions (`invoke_agent planner`, `execute_tool
calculator`), on by default; agl_otel reads them.

    agl worker packages/otel-adapter/examples/agent_framework_as_tool.py:solve

The app itself is unchanged: its client reads OPENAI_BASE_URL / OPENAI_API_KEY, which `agl worker` points at the
run. The lines agl needs are marked `# agl`.
"""

from __future__ import annotations

import re
from typing import Any

from agent_framework import Agent, tool
from agent_framework.openai import OpenAIChatCompletionClient

import agl  # agl
import agl_otel  # agl


@tool
def calculator(expression: str) -> str:
    """Evaluate `<int> <op> <int>`, with op one of + - * /."""
    found = re.fullmatch(r"\s*(-?\d+)\s*([+\-*/])\s*(-?\d+)\s*", expression)
    if found is None:
        raise ValueError(f"not an expression: {expression!r}")
    a, op, b = int(found[1]), found[2], int(found[3])
    return str({"+": a + b, "-": a - b, "*": a * b, "/": a / b if op == "/" else 0}[op])


def build() -> Agent[Any]:
    # the scripted test backend reads `agl-tools:` to know which tool to call; a real model reads instructions
    client = OpenAIChatCompletionClient(model="gpt-4o-mini")
    solver = Agent(
        client,
        "You are solver.\nagl-tools: calculator",
        name="solver",
        description="Solves one arithmetic question.",
        tools=[calculator],
    )
    return Agent(client, "You are planner.\nagl-tools: solver", name="planner", tools=[solver.as_tool()])


async def main(question: str) -> str:
    return (await build().run(question)).text


@agl.rollout  # agl
async def solve(task: dict[str, Any], llm: agl.LLM) -> float:  # agl
    agl_otel.instrument()  # agl
    numbers = re.findall(r"-?\d+(?:\.\d+)?", await main(task["question"]))  # agl
    return float(bool(numbers) and float(numbers[-1]) == float(task["answer"]))  # agl
