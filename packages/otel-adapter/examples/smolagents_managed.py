"""A smolagents app with two agents: a manager that hands each question to a managed solver agent (smolagents'
agent-as-tool), and the solver's calculator tool, which raises on a division by zero. smolagents emits no
spans itself; `openinference-instrumentation-smolagents` adds OpenInference spans (kind AGENT for each agent's
run, TOOL for each tool), which agl_otel reads.

    agl worker packages/otel-adapter/examples/smolagents_managed.py:solve

The app itself is unchanged: its model comes from OPENAI_BASE_URL / OPENAI_API_KEY, which `agl worker` points at
the run. The lines agl needs are marked `# agl`.
"""

from __future__ import annotations

import os
import re
from typing import Any

from openinference.instrumentation.smolagents import SmolagentsInstrumentor
from smolagents import LogLevel, OpenAIModel, ToolCallingAgent, tool

import agl  # agl
import agl_otel  # agl

# once, at import: OpenInference's instrument() is not thread-safe, and a worker runs rollouts at once
SmolagentsInstrumentor().instrument()  # agl: smolagents' spans, unless the app already has them on


@tool
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


def build() -> ToolCallingAgent:
    # the scripted test backend reads `agl-tools:` to know which tool to call; a real model reads instructions
    model = OpenAIModel(
        "gpt-4o-mini", api_base=os.environ.get("OPENAI_BASE_URL"), api_key=os.environ.get("OPENAI_API_KEY")
    )
    solver = ToolCallingAgent(
        tools=[calculator],
        model=model,
        name="solver",
        description="Solves one arithmetic question.",
        instructions="You are solver.\nagl-tools: calculator, final_answer",
        max_steps=3,
        verbosity_level=LogLevel.OFF,
    )
    return ToolCallingAgent(
        tools=[],
        model=model,
        managed_agents=[solver],
        name="manager",
        instructions="You are manager.\nagl-tools: solver, final_answer",
        max_steps=3,
        verbosity_level=LogLevel.OFF,
    )


def main(question: str) -> str:
    return str(build().run(question))


@agl.rollout  # agl
def solve(task: dict[str, Any], llm: agl.LLM) -> float:  # agl
    agl_otel.instrument()  # agl
    numbers = re.findall(r"-?\d+(?:\.\d+)?", main(task["question"]))  # agl
    return float(bool(numbers) and float(numbers[-1]) == float(task["answer"]))  # agl
