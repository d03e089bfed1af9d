"""A LangGraph app in the shape of LangChain's supervisor tutorial: a supervisor agent that hands each question to
a solver sub-agent wrapped as a tool, and the solver's calculator, which fails on a division by zero. Both are
LangChain 1.x `create_agent` agents, traced by OpenInference (`openinference-instrumentation-langchain`), which
agl_otel reads.

    agl worker packages/otel-adapter/examples/langgraph_openinference_supervisor.py:solve

OpenInference's LangChain instrumentor sets a span's attributes when it ends, so agl_otel takes the acting agent
from LangGraph's own runtime state (the `lc_agent_name` each agent's nodes carry, agl_otel.runtime_agents). The app
itself is unchanged: its model comes from OPENAI_BASE_URL / OPENAI_API_KEY, which `agl worker` points at the run.
The lines agl needs are marked `# agl`.
"""

from __future__ import annotations

import re
from typing import Any

from langchain.agents import create_agent
from langchain_core.tools import ToolException, tool
from langchain_openai import ChatOpenAI
from openinference.instrumentation.langchain import LangChainInstrumentor

import agl  # agl
import agl_otel  # agl

# once, at import: OpenInference's instrument() is not thread-safe, and a worker runs rollouts at once
LangChainInstrumentor().instrument()  # agl: LangChain's spans, unless the app already has them on


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression of two integers: `<int> <op> <int>`, with op one of + - * /."""
    found = re.fullmatch(r"\s*(-?\d+)\s*([+\-*/])\s*(-?\d+)\s*", expression)
    if found is None:
        raise ToolException(f"not an expression: {expression!r}")
    a, op, b = int(found[1]), found[2], int(found[3])
    if op == "/" and b == 0:
        raise ToolException("division by zero")
    return str({"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else 0}[op])


calculator.handle_tool_error = True  # the agent reads the error and answers, as the tutorial's tools do

# the scripted test backend reads `agl-tools:` to know which tool to call; a real model reads the instructions
model = ChatOpenAI(model="gpt-4o-mini")
solver = create_agent(model, tools=[calculator], system_prompt="You are solver.\nagl-tools: calculator", name="solver")


@tool
def ask_solver(request: str) -> str:
    """Ask the solver, an agent that solves one arithmetic question."""
    answer = solver.invoke({"messages": [{"role": "user", "content": request}]})
    return str(answer["messages"][-1].content)


supervisor = create_agent(
    model, tools=[ask_solver], system_prompt="You are supervisor.\nagl-tools: ask_solver", name="supervisor"
)


def main(question: str) -> str:
    answer = supervisor.invoke({"messages": [{"role": "user", "content": question}]})
    return str(answer["messages"][-1].content)


@agl.rollout  # agl
def solve(task: dict[str, Any], llm: agl.LLM) -> float:  # agl
    agl_otel.instrument()  # agl
    numbers = re.findall(r"-?\d+(?:\.\d+)?", main(task["question"]))  # agl
    return float(bool(numbers) and float(numbers[-1]) == float(task["answer"]))  # agl
