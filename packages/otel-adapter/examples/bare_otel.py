"""Two agents written with nothing but a plain OpenAI client and OpenTelemetry spans in the GenAI semantic
conventions: a planner that hands the question to a solver (an agent inside an agent), and the solver's
calculator tool, which fails on division by zero. No framework: what `agl_otel` reads is the spans alone.

    agl worker packages/otel-adapter/examples/bare_otel.py:solve

Instrumented with two lines (`import agl_otel`, `agl_otel.instrument()`) and the rollout function around `main`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from openai import OpenAI
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

import agl
import agl_otel

tracer = trace.get_tracer("bare-otel-agents")


def calculator(expression: str) -> str:
    """`<int> <op> <int>`, evaluated; raises on anything else and on division by zero."""
    found = re.fullmatch(r"\s*(-?\d+)\s*([+\-*/])\s*(-?\d+)\s*", expression)
    if found is None:
        raise ValueError(f"not an expression: {expression!r}")
    a, op, b = int(found[1]), found[2], int(found[3])
    if op == "/":
        return str(a / b)  # ZeroDivisionError for b == 0: the tool's span says so
    return str({"+": a + b, "-": a - b, "*": a * b}[op])


def run_tool(name: str, call_id: str, arguments: str, fn: Any) -> str:
    with tracer.start_as_current_span(
        f"execute_tool {name}",
        attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name, "gen_ai.tool.call.id": call_id},
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            result = str(fn(arguments))
        except Exception as exc:  # the model gets the error as the tool's result, as frameworks do
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            span.set_attribute("error.type", type(exc).__name__)
            return f"error: {exc}"
        span.set_attribute("gen_ai.tool.call.result", result)
        return result


def solver(client: OpenAI, model: str, question: str) -> str:
    with tracer.start_as_current_span(
        "invoke_agent solver",
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "solver", "gen_ai.agent.id": "s-1"},
    ):
        messages: list[Any] = [
            {"role": "system", "content": "You are solver.\nagl-tools: calculator"},
            {"role": "user", "content": question},
        ]
        tools = [
            {
                "type": "function",
                "function": {
                    "name": "calculator",
                    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
                },
            }
        ]
        first = client.chat.completions.create(model=model, messages=messages, tools=tools).choices[0].message
        for call in first.tool_calls or []:
            expression = json.loads(call.function.arguments)["expression"]
            result = run_tool("calculator", call.id, expression, calculator)
            messages += [
                first.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": result},
            ]
        answer = client.chat.completions.create(model=model, messages=messages).choices[0].message
        return answer.content or ""


def main(client: OpenAI, model: str, question: str) -> str:
    with tracer.start_as_current_span(
        "invoke_agent planner", attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "planner"}
    ):
        plan = client.chat.completions.create(
            model=model,
            messages=[
                {"role": "system", "content": "You are planner.\nagl-say: Ask the solver."},
                {"role": "user", "content": question},
            ],
        )
        assert plan.choices[0].message.content
        return solver(client, model, question)


@agl.rollout
def solve(task: dict[str, Any], llm: agl.LLM) -> float:
    agl_otel.instrument()
    client = OpenAI(base_url=llm.base_url, api_key=llm.api_key)
    answer = main(client, llm.model, task["question"])
    numbers = re.findall(r"-?\d+(?:\.\d+)?", answer)
    return float(bool(numbers) and float(numbers[-1]) == float(task["answer"]))
