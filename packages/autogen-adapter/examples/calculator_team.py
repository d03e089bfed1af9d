"""An AutoGen team that answers arithmetic questions, made trainable with agl.

A `RoundRobinGroupChat` of two AssistantAgents: the `solver` works the answer out with a calculator tool, the
`verifier` checks it and says APPROVE (which ends the chat). The reward is 1 when the solver's final number is
the expected answer. The lines marked `# agl` are all the integration there is.

    agl serve &                                         # the store and the LLM proxy, on 127.0.0.1:8765
    agl worker examples/calculator_team.py:solve        # runs rollouts of `solve` for the server
    AGL_TRAIN_AGENTS=solver agl train examples/calculator_team.py:solve --tasks tasks.jsonl   # train the solver

A task is `{"question": "What is 12+30?", "answer": 42}`; it may also carry `solver_prompt` / `verifier_prompt`
to run the same team with other instructions (prompt experiments, the scripted test model).
"""

from __future__ import annotations

import ast
import asyncio
import operator
import re
from collections.abc import Callable
from typing import Any

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.base import TaskResult
from autogen_agentchat.conditions import MaxMessageTermination, TextMentionTermination
from autogen_agentchat.messages import BaseChatMessage
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_ext.models.openai import OpenAIChatCompletionClient

import agl  # agl
import agl_autogen  # agl

agl_autogen.instrument()  # agl: agents' LLM calls carry their names, tool calls become spans

SOLVER_PROMPT = (
    "You solve arithmetic questions. Use the calculator tool for every computation, never compute in your head. "
    "End with the final number."
)
VERIFIER_PROMPT = (
    "You check the solver's answer to the user's question. If it is right, reply APPROVE and repeat the number. "
    "Otherwise explain the mistake."
)

_OPERATORS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _evaluate(node.operand)
        return value if isinstance(node.op, ast.UAdd) else -value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ValueError("exponent too large")
        return _OPERATORS[type(node.op)](left, right)  # type: ignore[no-any-return]
    raise ValueError(f"unsupported expression element: {ast.dump(node)[:60]}")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as '12 * (3 + 4)'; supports + - * / // % ** and parentheses."""
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from exc
    value = _evaluate(tree.body)  # raises on anything but numbers and operators, and on division by zero
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def model_client(llm: agl.LLM) -> OpenAIChatCompletionClient:
    # The model behind agl's proxy is not an OpenAI model, so AutoGen needs to be told what it can do.
    return OpenAIChatCompletionClient(
        model=llm.model,
        base_url=llm.base_url,
        api_key=llm.api_key,
        model_info={
            "vision": False,
            "function_calling": True,
            "json_output": False,
            "structured_output": False,
            "family": "unknown",
        },
    )


def build_team(task: dict[str, Any], client: OpenAIChatCompletionClient, *, streaming: bool) -> RoundRobinGroupChat:
    solver = AssistantAgent(
        "solver",
        model_client=client,
        tools=[calculator],
        system_message=task.get("solver_prompt", SOLVER_PROMPT),
        reflect_on_tool_use=True,  # the solver states the answer after seeing the tool's result
        model_client_stream=streaming,
    )
    verifier = AssistantAgent(
        "verifier",
        model_client=client,
        system_message=task.get("verifier_prompt", VERIFIER_PROMPT),
        model_client_stream=streaming,
    )
    stop = TextMentionTermination("APPROVE", sources=["verifier"]) | MaxMessageTermination(6)
    return RoundRobinGroupChat([solver, verifier], termination_condition=stop)


async def run_team(task: dict[str, Any], llm: agl.LLM, *, streaming: bool = False) -> TaskResult:
    client = model_client(llm)
    try:
        team = build_team(task, client, streaming=streaming)
        if not streaming:
            return await team.run(task=task["question"])
        result: TaskResult | None = None
        async for event in team.run_stream(task=task["question"]):
            if isinstance(event, TaskResult):
                result = event
        assert result is not None
        return result
    finally:
        await client.close()


def final_answer(result: TaskResult) -> float | None:
    """The last number the solver said."""
    for message in reversed(result.messages):
        if isinstance(message, BaseChatMessage) and message.source == "solver":
            numbers = re.findall(r"-?\d+(?:\.\d+)?", message.to_text())
            return float(numbers[-1]) if numbers else None
    return None


def reward(result: TaskResult, task: dict[str, Any]) -> float:
    answer = final_answer(result)
    return 1.0 if answer is not None and abs(answer - float(task["answer"])) < 1e-6 else 0.0


@agl.rollout  # agl
def solve(task: dict[str, Any], llm: agl.LLM) -> float:
    """Sync entry point: AutoGen is async, so the team runs in its own event loop."""
    return reward(asyncio.run(run_team(task, llm)), task)


@agl.rollout  # agl
async def solve_async(task: dict[str, Any], llm: agl.LLM) -> float:
    return reward(await run_team(task, llm), task)


@agl.rollout  # agl
async def solve_streaming(task: dict[str, Any], llm: agl.LLM) -> float:
    """The same team with token streaming from the model (`model_client_stream=True`) and `run_stream`."""
    return reward(await run_team(task, llm, streaming=True), task)
