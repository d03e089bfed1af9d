"""A DSPy app with two agents: a planner ReAct agent whose tool asks a solver ReAct agent (DSPy's agent-as-tool:
a function that calls the other module), and the solver's calculator tool, which raises on a division by zero.
DSPy emits no spans itself; `openinference-instrumentation-dspy` adds OpenInference spans (CHAIN for each module,
TOOL for each tool), which agl_otel reads.

    agl worker packages/otel-adapter/examples/dspy_react_delegation.py:solve

The agents are `dspy.ReActV2`, which offers its tools to the model as native function calls (`dspy.ReAct` asks for
them as text fields instead). DSPy has no agent names, so the app names each agent's run with OpenInference's
`using_metadata({"agent_name": ...})`. The app itself is otherwise unchanged: its model comes from
OPENAI_BASE_URL / OPENAI_API_KEY, which `agl worker` points at the run. The lines agl needs are marked `# agl`.
"""

from __future__ import annotations

import os
import re
from typing import Any

import dspy
from openinference.instrumentation import using_metadata  # agl
from openinference.instrumentation.dspy import DSPyInstrumentor

import agl  # agl
import agl_otel  # agl

# once, when the worker loads the app: the instrumentor's already-instrumented check is not atomic, and rollouts run
# at once in threads would each wrap DSPy again (every span twice)
DSPyInstrumentor().instrument()  # agl: DSPy's spans, unless the app already has them on


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression of two integers, `<int> <op> <int>` with op one of + - * /."""
    found = re.fullmatch(r"\s*(-?\d+)\s*([+\-*/])\s*(-?\d+)\s*", expression)
    if found is None:
        raise ValueError(f"not an expression: {expression!r}")
    a, op, b = int(found[1]), found[2], int(found[3])
    return str({"+": a + b, "-": a - b, "*": a * b, "/": a / b if op == "/" else 0}[op])


def build() -> dspy.Module:
    # the scripted test backend reads `agl-tools:` to know which tool to call; a real model reads instructions
    solver = dspy.ReActV2(
        dspy.Signature("question -> answer", "You are solver.\nagl-tools: calculator, submit"),
        tools=[calculator],
        max_iters=3,
    )

    def ask_solver(question: str) -> str:
        """Ask the solver agent one arithmetic question."""
        with using_metadata({"agent_name": "solver"}):  # agl: names the agent its spans run for
            return str(solver(question=question).answer)

    return dspy.ReActV2(
        dspy.Signature("question -> answer", "You are planner.\nagl-tools: ask_solver, submit"),
        tools=[ask_solver],
        max_iters=3,
    )


def main(question: str) -> str:
    # no cache: a repeated question must reach the model again; a model name that litellm knows to call functions
    lm = dspy.LM(
        "openai/gpt-4o-mini",
        api_base=os.environ.get("OPENAI_BASE_URL"),
        api_key=os.environ.get("OPENAI_API_KEY"),
        cache=False,
    )
    adapter = dspy.ChatAdapter(use_native_function_calling=True)  # tools as function calls, not text fields
    with dspy.context(lm=lm, adapter=adapter), using_metadata({"agent_name": "planner"}):  # agl: names the agent
        return str(build()(question=question).answer)


@agl.rollout  # agl
def solve(task: dict[str, Any], llm: agl.LLM) -> float:  # agl
    agl_otel.instrument()  # agl
    numbers = re.findall(r"-?\d+(?:\.\d+)?", main(task["question"]))  # agl
    return float(bool(numbers) and float(numbers[-1]) == float(task["answer"]))  # agl
