"""An OpenAI Agents SDK app as its authors wrote it: the SDK's default model (`OpenAIResponsesModel`, the
Responses API) and its default client, configured by the environment (`OPENAI_BASE_URL`, `OPENAI_API_KEY`).
The only agl lines are the marked ones; the worker is started with `OPENAI_BASE_URL=<agl server>/v1`."""

from __future__ import annotations

from typing import Any

from agents import Agent, Runner, function_tool

import agl  # agl
import agl_openai_agents  # agl


@function_tool
def calculator(expression: str) -> str:
    """Evaluate `<int><op><int>`."""
    left, op, right = expression.partition("*")[0], "*", expression.partition("*")[2]
    if not op or not right:
        raise ValueError(f"cannot evaluate {expression!r}")
    return str(int(left) * int(right))


def build(instructions: dict[str, str]) -> Agent[Any]:
    math = Agent(name="math", instructions=instructions["math"], tools=[calculator])
    return Agent(name="triage", instructions=instructions["triage"], handoffs=[math])


@agl.rollout  # agl
async def solve(task: dict[str, Any], llm: agl.LLM) -> float:  # agl: llm unused, the client is global
    agl_openai_agents.instrument()  # agl
    result = await Runner.run(build(task["instructions"]), task["question"])
    return 1.0 if str(result.final_output).endswith(str(task["answer"])) else 0.0
