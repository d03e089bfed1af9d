"""A triage agent that hands arithmetic questions to a math agent with a calculator: an OpenAI Agents SDK app
trained with agl.

    agl worker packages/openai-agents-adapter/examples/triage_handoff.py:solve --server http://127.0.0.1:8000

A task is `{"question": "What is 12 * 7?", "answer": 84}`; the reward is 1 when the final answer's last number is
the right one. Train only the math agent with `AGL_TRAIN_AGENTS=math`: triage's calls are still stored, but
only math's become training transitions. The lines marked `# agl` are all the integration there is.

A task may also carry `"instructions": {"triage": ..., "math": ...}` to replace the agents' prompts; the tests
use it to drive a scripted stand-in for the model.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable, Mapping
from typing import Any

from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner, function_tool
from openai import AsyncOpenAI

import agl  # agl
import agl_openai_agents  # agl

TRIAGE_INSTRUCTIONS = (
    "You are the triage agent of a help desk. Call `classify` on the user's question. If it is arithmetic, "
    "hand off to the math agent; otherwise answer it briefly yourself."
)
MATH_INSTRUCTIONS = (
    "You are the math agent. Never compute in your head: call `calculator` with the arithmetic expression, "
    "then reply with one sentence that ends with the number, e.g. 'The answer is 42.'"
)

_OPERATORS: dict[type[ast.AST], Callable[..., float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
_MAX_EXPONENT = 100


def evaluate(expression: str) -> float:
    """The value of an arithmetic expression, parsed with `ast` (never `eval`); ValueError on anything else."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}")

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return float(node.value)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
                raise ValueError(f"exponent {right:g} is too large")
            if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
                raise ValueError("division by zero")
            return _OPERATORS[type(node.op)](left, right)
        raise ValueError(f"unsupported in arithmetic: {ast.unparse(node)!r}")

    try:
        return value(tree.body)
    except OverflowError:
        raise ValueError(f"result of {expression!r} is too large")


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as `12 * (3 + 4)` and return the result."""
    result = evaluate(expression)
    return str(int(result)) if result.is_integer() else f"{result:.10g}"


@function_tool
def classify(question: str) -> str:
    """Say whether a question is `arithmetic` (numbers joined by operators) or `other`."""
    return "arithmetic" if re.search(r"\d\s*[-+*/^%]\s*\d", question) else "other"


def build_agents(instructions: Mapping[str, str] | None = None) -> Agent[Any]:
    """The triage agent, which can hand off to the math agent; `instructions` replaces prompts by agent name."""
    prompts = {"triage": TRIAGE_INSTRUCTIONS, "math": MATH_INSTRUCTIONS, **(instructions or {})}
    math_agent = Agent(
        name="math",
        handoff_description="Solves arithmetic questions with a calculator.",
        instructions=prompts["math"],
        tools=[calculator],
    )
    return Agent(name="triage", instructions=prompts["triage"], tools=[classify], handoffs=[math_agent])


def reward(final_output: Any, answer: float) -> float:
    """1 when the last number in the final answer is the expected one, else 0."""
    numbers = re.findall(r"-?\d+(?:\.\d+)?", str(final_output).replace(",", ""))
    return 1.0 if numbers and math.isclose(float(numbers[-1]), float(answer), rel_tol=1e-6) else 0.0


@agl.rollout  # agl
async def solve(task: dict[str, Any], llm: agl.LLM) -> float:
    agl_openai_agents.instrument()  # agl: name each agent's LLM calls, record tool spans (idempotent)
    async with AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key) as client:  # agl: the model being trained
        # One model for every agent of the run, handoffs included; the agl proxy speaks Chat Completions.
        model = OpenAIChatCompletionsModel(model=llm.model, openai_client=client)
        result = await Runner.run(
            build_agents(task.get("instructions")), task["question"], run_config=RunConfig(model=model)
        )
    return reward(result.final_output, task["answer"])
