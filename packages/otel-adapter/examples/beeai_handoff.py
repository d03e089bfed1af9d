"""A BeeAI app in the shape of its handoff examples: a `RequirementAgent` planner hands each question off to a solver
(`HandoffTool`), and the solver's calculator fails on a division by zero. Traced by OpenInference
(`openinference-instrumentation-beeai`), which agl_otel reads.

    agl worker packages/otel-adapter/examples/beeai_handoff.py:solve

OpenInference's BeeAI instrumentor writes a run's spans only when the run's outermost agent has finished, so
agl_otel takes the acting agent from BeeAI's own run contexts (agl_otel.runtime_agents). BeeAI's OpenAI model reads
OPENAI_API_BASE, which `agl worker` sets, and samples greedily (`temperature: 0`): a run that trains these agents
owns their sampling (`agl train` does; `agl serve --own-sampling-for planner,solver`). The app itself is
unchanged; the lines agl needs are marked `# agl`.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from beeai_framework.adapters.openai import OpenAIChatModel
from beeai_framework.agents.requirement import RequirementAgent
from beeai_framework.tools import StringToolOutput, tool
from beeai_framework.tools.handoff import HandoffTool
from openinference.instrumentation.beeai import BeeAIInstrumentor

import agl  # agl
import agl_otel  # agl

# once, at import: OpenInference's instrument() is not thread-safe, and a worker runs rollouts at once
BeeAIInstrumentor().instrument()  # agl: BeeAI's spans, unless the app already has them on


@tool
def calculator(expression: str) -> StringToolOutput:
    """Evaluate an arithmetic expression of two integers: `<int> <op> <int>`, with op one of + - * /."""
    found = re.fullmatch(r"\s*(-?\d+)\s*([+\-*/])\s*(-?\d+)\s*", expression)
    if found is None:
        raise ValueError(f"not an expression: {expression!r}")
    a, op, b = int(found[1]), found[2], int(found[3])
    return StringToolOutput(str({"+": a + b, "-": a - b, "*": a * b, "/": a / b if op == "/" else 0}[op]))


def model() -> OpenAIChatModel:
    return OpenAIChatModel("gpt-4o-mini")  # api_base and api_key from OPENAI_API_BASE / OPENAI_API_KEY


def planner() -> RequirementAgent:
    # the scripted test backend reads `agl-tools:` to know which tool to call
    solver = RequirementAgent(
        name="solver",
        description="Solves one arithmetic question.",
        llm=model(),
        tools=[calculator],
        instructions="You are solver.\nagl-tools: calculator",
        final_answer_as_tool=False,
    )
    return RequirementAgent(
        name="planner",
        description="Reads the question and hands it to the agent that can answer it.",
        llm=model(),
        tools=[HandoffTool(solver)],
        instructions="You are planner.\nagl-tools: solver",
        final_answer_as_tool=False,
    )


async def main(question: str) -> str:
    return (await planner().run(question)).last_message.text


def score(answer: str, expected: float) -> float:
    numbers = re.findall(r"-?\d+(?:\.\d+)?", answer)
    return float(bool(numbers) and float(numbers[-1]) == float(expected))


@agl.rollout  # agl
def solve(task: dict[str, Any], llm: agl.LLM) -> float:  # agl
    agl_otel.instrument()  # agl
    return score(asyncio.run(main(task["question"])), task["answer"])  # agl
