"""A small tool-using agent, written as any OpenAI-SDK agent is, plus the few agl lines that make it trainable.

The agl lines: the `@agl.rollout` decorator, the `llm` handle it receives (base URL, model, key), the agent
scopes that name who is acting, the tool span and the returned reward. Without a runner around it, the
function still runs as a plain agent (agl's calls are no-ops outside a rollout).
"""

from __future__ import annotations

import ast
import json
import operator
from typing import Any

import openai

import agl

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def calculate(expression: str) -> float:
    """Evaluate arithmetic without `eval`: only numbers and the four operations are accepted."""

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))  # type: ignore[operator]
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.operand))  # type: ignore[operator]
        raise ValueError(f"not an arithmetic expression: {expression!r}")

    return walk(ast.parse(expression, mode="eval").body)


def _number(text: str) -> float | None:
    for token in reversed(text.replace(",", "").split()):
        try:
            return float(token.strip(".!?"))
        except ValueError:
            continue
    return None


@agl.rollout
def calc_agent(task: dict[str, Any], llm: agl.LLM) -> float:
    """Ask the model, run the calculator when it calls it, answer; reward 1 for the right number."""
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=1)
    messages: list[Any] = [{"role": "user", "content": task["question"]}]
    with agl.agent("solver"):
        reply = client.chat.completions.create(model=llm.model, messages=messages, tools=[CALCULATOR]).choices[0]
    for call in reply.message.tool_calls or []:
        messages.append(reply.message.model_dump(exclude_none=True))
        with agl.tool("calculator", call_id=call.id, arguments=call.function.arguments) as span:
            try:
                result = str(calculate(json.loads(call.function.arguments)["expression"]))
            except (ValueError, KeyError, SyntaxError, ZeroDivisionError, json.JSONDecodeError) as exc:
                result = f"error: {exc}"
                span.set_status("error", result)
        messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        with agl.agent("solver"):
            reply = client.chat.completions.create(model=llm.model, messages=messages, tools=[CALCULATOR]).choices[0]
    answer = _number(reply.message.content or "")
    return 1.0 if answer is not None and abs(answer - float(task["answer"])) < 1e-6 else 0.0
