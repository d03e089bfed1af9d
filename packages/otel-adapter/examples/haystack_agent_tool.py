"""A Haystack app with two agents: a planner `Agent` that hands each question to a solver `Agent` through a tool
that runs it, and the solver's calculator tool, which raises on a division by zero (Haystack hands the error back
to the model). `openinference-instrumentation-haystack` adds OpenInference spans (one per component run:
`Agent.run`, `ChatPromptBuilder.run`, `OpenAIChatGenerator.run`), which agl_otel reads.

The solver is a function tool, not `ComponentTool(solver)` / `AgentTool(solver)`: those take the task as a
`messages` array of chat messages, which the scripted test backend cannot fill, and they call the solver's `run`
themselves, leaving the app no place to name the solver's run.

    agl worker packages/otel-adapter/examples/haystack_agent_tool.py:solve

Haystack's agents have no names, and the instrumentor sets a component span's attributes only after the span
starts, so the app names each agent's run with OpenInference's `using_metadata({"agent_name": ...})`, which the
tracer copies into the span's `metadata` as it starts. The app is otherwise unchanged: its model comes from
OPENAI_BASE_URL / OPENAI_API_KEY, which `agl worker` points at the run. The lines agl needs are marked `# agl`.
"""

from __future__ import annotations

import re
from typing import Any

from haystack.components.agents import Agent
from haystack.components.generators.chat import OpenAIChatGenerator
from haystack.dataclasses import ChatMessage
from haystack.tools import create_tool_from_function
from openinference.instrumentation import using_metadata  # agl
from openinference.instrumentation.haystack import HaystackInstrumentor

import agl  # agl
import agl_otel  # agl

# once, at import and after the components it traces are imported: OpenInference's instrument() is not
# thread-safe (a worker runs rollouts at once), and it wraps only the component classes imported by then
HaystackInstrumentor().instrument()  # agl: Haystack's spans, unless the app already has them on


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression of two integers, `<int> <op> <int>` with op one of + - * /."""
    found = re.fullmatch(r"\s*(-?\d+)\s*([+\-*/])\s*(-?\d+)\s*", expression)
    if found is None:
        raise ValueError(f"not an expression: {expression!r}")
    a, op, b = int(found[1]), found[2], int(found[3])
    return str({"+": a + b, "-": a - b, "*": a * b, "/": a / b if op == "/" else 0}[op])


def build() -> Agent:
    # the scripted test backend reads `agl-tools:` to know which tool to call; a real model reads the prompt.
    # OpenAIChatGenerator reads OPENAI_API_KEY and OPENAI_BASE_URL itself
    solver = Agent(
        chat_generator=OpenAIChatGenerator(model="gpt-4o-mini"),
        tools=[create_tool_from_function(calculator)],
        system_prompt="You are solver.\nagl-tools: calculator",
        max_agent_steps=3,
    )

    def ask_solver(question: str) -> str:
        """Ask the solver agent one arithmetic question."""
        with using_metadata({"agent_name": "solver"}):  # agl: names the agent its spans run for
            return str(solver.run(messages=[ChatMessage.from_user(question)])["last_message"].text)

    return Agent(
        chat_generator=OpenAIChatGenerator(model="gpt-4o-mini"),
        tools=[create_tool_from_function(ask_solver, name="solver")],
        system_prompt="You are planner.\nagl-tools: solver",
        max_agent_steps=3,
    )


def main(question: str) -> str:
    with using_metadata({"agent_name": "planner"}):  # agl
        result = build().run(messages=[ChatMessage.from_user(question)])
    return str(result["last_message"].text)


@agl.rollout  # agl
def solve(task: dict[str, Any], llm: agl.LLM) -> float:  # agl
    agl_otel.instrument()  # agl
    numbers = re.findall(r"-?\d+(?:\.\d+)?", main(task["question"]))  # agl
    return float(bool(numbers) and float(numbers[-1]) == float(task["answer"]))  # agl
