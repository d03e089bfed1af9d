"""A LlamaIndex app in the shape of its multi-agent notebook: an `AgentWorkflow` whose planner hands each question
off to a solver, and the solver's calculator, which fails on a division by zero; `solve_alone` runs the solver as
a lone `FunctionAgent`. Traced by OpenInference (`openinference-instrumentation-llama-index`), which agl_otel reads.

    agl worker packages/otel-adapter/examples/llama_index_agent_workflow.py:solve

OpenInference's LlamaIndex instrumentor sets a span's attributes when it ends, so agl_otel takes the acting agent
from LlamaIndex's own instrumentation (the agent each workflow step runs, agl_otel.runtime_agents). LlamaIndex's
OpenAI client reads OPENAI_API_BASE (not OPENAI_BASE_URL), which `agl worker` sets too. The app itself is
unchanged; the lines agl needs are marked `# agl`.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from llama_index.core.agent.workflow import AgentWorkflow, FunctionAgent
from llama_index.llms.openai_like import OpenAILike
from openinference.instrumentation.llama_index import LlamaIndexInstrumentor

import agl  # agl
import agl_otel  # agl

# once, at import: OpenInference's instrument() is not thread-safe, and a worker runs rollouts at once
LlamaIndexInstrumentor().instrument()  # agl: LlamaIndex's spans, unless the app already has them on


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression of two integers: `<int> <op> <int>`, with op one of + - * /."""
    found = re.fullmatch(r"\s*(-?\d+)\s*([+\-*/])\s*(-?\d+)\s*", expression)
    if found is None:
        raise ValueError(f"not an expression: {expression!r}")
    a, op, b = int(found[1]), found[2], int(found[3])
    return str({"+": a + b, "-": a - b, "*": a * b, "/": a / b if op == "/" else 0}[op])


def model() -> OpenAILike:
    # OpenAILike: an OpenAI-compatible server; api_base and api_key from OPENAI_API_BASE / OPENAI_API_KEY
    return OpenAILike(model="gpt-4o-mini", is_chat_model=True, is_function_calling_model=True)


def solver() -> FunctionAgent:
    # the scripted test backend reads `agl-tools:` (and `agl-args:`) to know which tool to call
    return FunctionAgent(
        name="solver",
        description="Solves one arithmetic question.",
        tools=[calculator],
        llm=model(),
        system_prompt="You are solver.\nagl-tools: calculator",
    )


def workflow() -> AgentWorkflow:
    planner = FunctionAgent(
        name="planner",
        description="Reads the question and hands it to the agent that can answer it.",
        tools=[],
        llm=model(),
        system_prompt="You are planner.\nagl-tools: handoff\nagl-args: handoff.to_agent=solver",
        can_handoff_to=["solver"],
    )
    return AgentWorkflow(agents=[planner, solver()], root_agent="planner")


async def main(question: str, alone: bool = False) -> str:
    runner = solver() if alone else workflow()
    return str(await runner.run(user_msg=question))


def score(answer: str, expected: float) -> float:
    numbers = re.findall(r"-?\d+(?:\.\d+)?", answer)
    return float(bool(numbers) and float(numbers[-1]) == float(expected))


@agl.rollout  # agl
def solve(task: dict[str, Any], llm: agl.LLM) -> float:  # agl
    agl_otel.instrument()  # agl
    return score(asyncio.run(main(task["question"])), task["answer"])  # agl


@agl.rollout  # agl
def solve_alone(task: dict[str, Any], llm: agl.LLM) -> float:  # agl
    agl_otel.instrument()  # agl
    return score(asyncio.run(main(task["question"], alone=True)), task["answer"])  # agl
