"""The main job: an agent that must use a calculator tool to answer arithmetic questions that a 135 M model
cannot work out in its head, trained with `agl train --example calculator`.

The agent is ordinary OpenAI-SDK code; the agl parts are the decorator, the agent scope, the tool span (whose
error status AIR turns into a penalty) and the returned reward: 1 for the right number, else 0.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import random
import re
from typing import Any

import agl

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "for example 12 * (3 + 4)"}},
            "required": ["expression"],
        },
    },
}
SYSTEM = (
    "You are a careful assistant. You cannot do arithmetic in your head: call the calculator tool for every "
    "computation, then give the final answer as 'The answer is <number>.'"
)
MAX_TURNS = 3
# Worked exchanges shown to the model before the question (few-shot). Without any, the 135 M model never calls
# the tool (0 % held-out accuracy: nothing for RL to reinforce).
WORKED = [("What is 12 * 34?", "12 * 34", "408"), ("What is 71 + 19?", "71 + 19", "90")]
SHOTS = 2


def shown_examples(shots: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for i, (question, expression, result) in enumerate(WORKED[:shots]):
        call_id = f"call_example_{i}"
        messages += [
            {"role": "user", "content": question},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "calculator", "arguments": json.dumps({"expression": expression})},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": result},
            {"role": "assistant", "content": f"The answer is {result}."},
        ]
    return messages


_OPS: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def first_turn(question: str) -> list[dict[str, Any]]:
    """The messages of the agent's first call: the system prompt, the worked examples, the question."""
    return [{"role": "system", "content": SYSTEM}, *shown_examples(SHOTS), {"role": "user", "content": question}]


def calculate(expression: str) -> float:
    """Arithmetic without `eval`: numbers, + - * /, parentheses; anything else is refused."""

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return float(_OPS[type(node.op)](walk(node.left), walk(node.right)))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return float(_OPS[type(node.op)](walk(node.operand)))
        raise ValueError(f"not an arithmetic expression: {expression!r}")

    if len(expression) > 200:
        raise ValueError("expression too long")
    return walk(ast.parse(expression.strip(), mode="eval").body)


def format_number(value: float) -> str:
    return str(int(value)) if value == int(value) and abs(value) < 1e15 else f"{value:.6g}"


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def final_number(text: str) -> float | None:
    """The last number in the answer (thousands separators allowed)."""
    found = _NUMBER.findall(text or "")
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


PHRASINGS = [
    "What is {a} {op} {b}?",
    "Compute {a} {op} {b}.",
    "Calculate {a} {word} {b}.",
    "How much is {a} {word} {b}?",
    "{a} {op} {b} = ?",
    "Please tell me the value of {a} {op} {b}.",
    "I need to know {a} {word} {b}.",
    "Quick question: {a} {word} {b}?",
]
WORDS = {"+": "plus", "-": "minus", "*": "times"}


def make_tasks(n: int, *, seed: int) -> list[dict[str, Any]]:
    """Arithmetic over 2-3 digit numbers, asked in different ways: the worked examples show one phrasing, and
    the 135 M model reaches for the tool only on some of the others; it cannot compute the results itself."""
    rng = random.Random(seed)
    tasks = []
    for _ in range(n):
        op = rng.choice(["+", "-", "*", "*"])
        a, b = rng.randint(120, 999), rng.randint(12, 99 if op == "*" else 999)
        phrasing = rng.choice(PHRASINGS)
        tasks.append(
            {"question": phrasing.format(a=a, b=b, op=op, word=WORDS[op]), "answer": calculate(f"{a} {op} {b}")}
        )
    return tasks


def train_tasks() -> list[dict[str, Any]]:
    return make_tasks(400, seed=1)


def eval_tasks() -> list[dict[str, Any]]:
    seen = {t["question"] for t in train_tasks()}
    return [t for t in make_tasks(120, seed=2) if t["question"] not in seen][:96]


# `agl train --example calculator` uses these unless told otherwise. Rollouts and evaluations are sampled at
# temperature 0.7, the way such an agent runs; the model calls its tool reliably only when decoding greedily.
RECOMMENDED: dict[str, Any] = {
    "steps": 8,
    "tasks_per_step": 8,
    "group_size": 4,
    "eval_every": 4,
    "temperature": 0.7,
    "lr": 3e-4,
}


@agl.rollout
def solve(task: dict[str, Any], llm: agl.LLM) -> float:
    client = llm.openai_client(max_retries=1)
    messages: list[Any] = first_turn(task["question"])
    content = ""
    tools: list[Any] = [CALCULATOR]
    for _ in range(MAX_TURNS):
        with agl.agent("solver"):
            reply = client.chat.completions.create(
                model=llm.model, messages=messages, tools=tools, max_tokens=48
            ).choices[0]
        content = reply.message.content or ""
        if not reply.message.tool_calls:
            break
        messages.append(reply.message.model_dump(exclude_none=True))
        for call in reply.message.tool_calls:
            if call.type != "function":
                continue
            with agl.tool("calculator", call_id=call.id, arguments=call.function.arguments) as span:
                try:
                    result = format_number(calculate(str(json.loads(call.function.arguments)["expression"])))
                except (ValueError, KeyError, TypeError, SyntaxError, ZeroDivisionError, json.JSONDecodeError) as exc:
                    result = f"error: {exc}"
                    span.set_status("error", result)
                else:
                    agl.emit_reward(0.2, name="calculator_used")  # an intermediate reward: the right habit
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    answer = final_number(content)
    return (
        1.0 if answer is not None and math.isclose(answer, float(task["answer"]), rel_tol=1e-6, abs_tol=1e-6) else 0.0
    )
