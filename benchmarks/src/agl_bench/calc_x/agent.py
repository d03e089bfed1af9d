"""The Calc-X agent: one AutoGen AgentChat `AssistantAgent` named `solver` with a calculator tool.

The solver reads the question, calls `calculator` as often as it needs (up to `max_tool_iterations` rounds of
tool calls), then writes the final answer as `Answer: <value>` on its last line (the answer is read leniently:
see `evaluate.extract_answer`). Reward: 1.0 when the answer matches the gold `result` (`evaluate.is_equivalent`),
else 0.0; `report` also records `tool_calls` and `tool_errors` (calculator failures the model saw).

Task input: `{"id", "question", "result"}` (from `data.load`), and optionally:
- `prompts`: overrides of the prompts, `{"solver": <system message>, "user": <template with {question}>}`;
- `max_tokens`: the bound on each model answer (default 256);
- `max_tool_iterations`: how many rounds of tool calls the solver may make (default 4);
- `shots`: how many worked exchanges (question → calculator call → result → answer) precede the question (default 2).

`agl_autogen.instrument()` (called in `solve`, idempotent) makes the solver's LLM calls carry its name and turns
each tool call into a tool span, `error` when the calculator raised. The tool is an `async def` on purpose: the
adapter's context (rollout, agent name) does not reach the executor thread AutoGen runs sync tools in.
"""

from __future__ import annotations

import json
from typing import Any

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.base import TaskResult
from autogen_agentchat.messages import BaseChatMessage, ToolCallExecutionEvent
from autogen_core import FunctionCall
from autogen_core.model_context import UnboundedChatCompletionContext
from autogen_core.models import (
    AssistantMessage,
    FunctionExecutionResult,
    FunctionExecutionResultMessage,
    LLMMessage,
    ModelInfo,
    UserMessage,
)
from autogen_core.tools import FunctionTool
from autogen_ext.models.openai import OpenAIChatCompletionClient

import agl
import agl_autogen
from agl_bench.calc_x import AGENT_NAME, TOOL_NAME
from agl_bench.calc_x.calculator import calculate
from agl_bench.calc_x.evaluate import extract_answer, is_equivalent
from agl_bench.results import report

DEFAULT_MAX_TOKENS = 256
DEFAULT_MAX_TOOL_ITERATIONS = 4

SOLVER_PROMPT = (
    "You solve math word problems. For each calculation call the calculator tool with an arithmetic expression "
    "such as 3*12-5 or (2/5)*30. When done, write the final answer on the last line as: Answer: <number> "
    "(for a multiple-choice question, the option letter)."
)
# Worked exchanges put in the solver's history before the question (few-shot, with real tool calls): described
# only in words, SmolLM2-135M never calls the tool (0 tool calls on 20 test questions).
WORKED = [
    ("Ann has 3 bags of 12 apples and eats 5. How many apples are left?", "3*12-5", "31"),
    ("A book costs $8 and a pen costs $1.50. How much do 4 books and 2 pens cost?", "4*8+2*1.5", "35"),
]
DEFAULT_SHOTS = len(WORKED)
USER_PROMPT = "{question}"
PROMPT_KEYS = ("solver", "user")

MODEL_INFO = ModelInfo(
    vision=False,
    function_calling=True,
    json_output=False,
    structured_output=False,
    family="unknown",
)


async def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression, e.g. 3*(12-5)/2 or 2/5*30; + - * / ** ( ) and sqrt, round, min, max."""
    # Raising (CalculatorError: "division by zero", "unknown name 'x'", ...) is how the model sees the error
    # and how the adapter records the tool span as `error`.
    return calculate(expression)


def prompts(task: dict[str, Any]) -> dict[str, str]:
    overrides = task.get("prompts") or {}
    unknown = sorted(set(overrides) - set(PROMPT_KEYS))
    if unknown:
        raise ValueError(f"unknown prompt key(s) {', '.join(unknown)}; known: {', '.join(PROMPT_KEYS)}")
    return {"solver": SOLVER_PROMPT, "user": USER_PROMPT, **overrides}


def worked_messages(shots: int) -> list[LLMMessage]:
    messages: list[LLMMessage] = []
    for i, (question, expression, result) in enumerate(WORKED[:shots]):
        call_id = f"call_example_{i}"
        arguments = json.dumps({"expression": expression})
        messages += [
            UserMessage(content=question, source="user"),
            AssistantMessage(
                content=[FunctionCall(id=call_id, name=TOOL_NAME, arguments=arguments)], source=AGENT_NAME
            ),
            FunctionExecutionResultMessage(
                content=[FunctionExecutionResult(content=result, call_id=call_id, name=TOOL_NAME, is_error=False)]
            ),
            AssistantMessage(content=f"Answer: {result}", source=AGENT_NAME),
        ]
    return messages


def build_solver(task: dict[str, Any], client: OpenAIChatCompletionClient) -> AssistantAgent:
    tool = FunctionTool(calculator, description=calculator.__doc__ or "", name=TOOL_NAME)
    return AssistantAgent(
        AGENT_NAME,
        model_client=client,
        tools=[tool],
        system_message=prompts(task)["solver"],
        model_context=UnboundedChatCompletionContext(worked_messages(int(task.get("shots", DEFAULT_SHOTS)))),
        max_tool_iterations=int(task.get("max_tool_iterations", DEFAULT_MAX_TOOL_ITERATIONS)),
        reflect_on_tool_use=True,  # if the last round still called a tool, one more call states the answer
    )


def final_text(result: TaskResult) -> str:
    """What the solver said last (empty when it said nothing)."""
    for message in reversed(result.messages):
        if isinstance(message, BaseChatMessage) and message.source == AGENT_NAME:
            return message.to_text()
    return ""


def tool_counts(result: TaskResult) -> tuple[int, int]:
    """(tool calls, failed tool calls) of the run, from AutoGen's own execution events."""
    calls = errors = 0
    for message in result.messages:
        if isinstance(message, ToolCallExecutionEvent):
            calls += len(message.content)
            errors += sum(1 for r in message.content if r.is_error)
    return calls, errors


@agl.rollout
async def solve(task: dict[str, Any], llm: agl.LLM) -> float:
    agl_autogen.instrument()
    client = OpenAIChatCompletionClient(
        model=llm.model,
        base_url=llm.base_url,
        api_key=llm.api_key,
        model_info=MODEL_INFO,
        max_tokens=int(task.get("max_tokens", DEFAULT_MAX_TOKENS)),
    )
    try:
        solver = build_solver(task, client)
        result = await solver.run(task=prompts(task)["user"].format(question=task["question"]))
    finally:
        await client.close()
    text = final_text(result)
    answer = extract_answer(text)
    gold = str(task["result"])
    correct = answer is not None and is_equivalent(answer, gold, task["question"])
    calls, errors = tool_counts(result)
    accuracy = 1.0 if correct else 0.0
    report(
        {"accuracy": accuracy, "tool_calls": float(calls), "tool_errors": float(errors)},
        prediction=answer if answer is not None else text,
        gold=gold,
        id=task.get("id"),
        answered=answer is not None,
    )
    return accuracy
