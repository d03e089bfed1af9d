"""A Pydantic AI app with two agents: a planner that hands each question to a solver through a tool (agent
delegation, Pydantic AI's agent-as-tool), and the solver's calculator tool, which asks the model to retry
(`ModelRetry`) on a division by zero. Pydantic AI emits its own OpenTelemetry spans in the GenAI semantic
conventions (`invoke_agent planner`, `execute_tool calculator`); agl_otel reads them.

    agl worker packages/otel-adapter/examples/pydantic_ai_delegation.py:solve

The app itself is unchanged: its model comes from OPENAI_BASE_URL / OPENAI_API_KEY, which `agl worker` points at
the run. The lines agl needs are marked `# agl`.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic_ai import Agent, ModelRetry, RunContext
from pydantic_ai.models.openai import OpenAIChatModel

import agl  # agl
import agl_otel  # agl

# the scripted test backend reads `agl-tools:` to know which tool to call; a real model just reads instructions
planner = Agent(name="planner", instructions="You are planner.\nagl-tools: ask_solver")
solver = Agent(name="solver", instructions="You are solver.\nagl-tools: calculator")


@planner.tool
async def ask_solver(ctx: RunContext[None], question: str) -> str:
    """Hand the question to the solver agent; its answer comes back as this tool's result."""
    result = await solver.run(question, model=ctx.model)
    return result.output


@solver.tool_plain
def calculator(expression: str) -> str:
    """Evaluate `<int> <op> <int>`."""
    found = re.fullmatch(r"\s*(-?\d+)\s*([+\-*/])\s*(-?\d+)\s*", expression)
    if found is None:
        raise ModelRetry(f"not an expression: {expression!r}")
    a, op, b = int(found[1]), found[2], int(found[3])
    if op == "/" and b == 0:
        raise ModelRetry("division by zero")
    return str({"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else 0}[op])


async def main(question: str) -> str:
    result = await planner.run(question, model=OpenAIChatModel("gpt-4o-mini"))
    return result.output


@agl.rollout  # agl
async def solve(task: dict[str, Any], llm: agl.LLM) -> float:  # agl
    agl_otel.instrument()  # agl
    Agent.instrument_all()  # agl: Pydantic AI's spans, off unless the app already turned them on
    numbers = re.findall(r"-?\d+(?:\.\d+)?", await main(task["question"]))  # agl
    return float(bool(numbers) and float(numbers[-1]) == float(task["answer"]))  # agl
