"""An Agno app with two agents: a planner Team that hands the question to its member, a solver Agent (Agno's team
of agents, in broadcast mode: the leader's `delegate_task_to_members` tool runs every member on the task), and the
solver's calculator tool, which raises on a division by zero. Agno emits no spans itself;
`openinference-instrumentation-agno` adds OpenInference spans (kind AGENT with `agent.name` for each team and agent
run, TOOL for each tool), which agl_otel reads.

    agl worker packages/otel-adapter/examples/agno_team.py:solve

The app itself is unchanged: its model comes from OPENAI_BASE_URL / OPENAI_API_KEY, which `agl worker` points at
the run. The lines agl needs are marked `# agl`.
"""

from __future__ import annotations

import os
import re
from typing import Any

from agno.agent import Agent
from agno.models.openai import OpenAIChat
from agno.team import Team, TeamMode
from openinference.instrumentation.agno import AgnoInstrumentor

import agl  # agl
import agl_otel  # agl

# once, when the worker loads the app: the instrumentor's already-instrumented check is not atomic, and rollouts run
# at once in threads would each wrap Agno again (every span twice)
AgnoInstrumentor().instrument()  # agl: Agno's spans, unless the app already has them on


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression of two integers.

    Args:
        expression: `<int> <op> <int>`, with op one of + - * /.
    """
    found = re.fullmatch(r"\s*(-?\d+)\s*([+\-*/])\s*(-?\d+)\s*", expression)
    if found is None:
        raise ValueError(f"not an expression: {expression!r}")
    a, op, b = int(found[1]), found[2], int(found[3])
    return str({"+": a + b, "-": a - b, "*": a * b, "/": a / b if op == "/" else 0}[op])


def _model() -> OpenAIChat:
    return OpenAIChat(
        id="gpt-4o-mini", base_url=os.environ.get("OPENAI_BASE_URL"), api_key=os.environ.get("OPENAI_API_KEY")
    )


def build() -> Team:
    # the scripted test backend reads `agl-tools:` to know which tool to call; a real model reads instructions
    solver = Agent(
        name="solver",
        role="Solves one arithmetic question.",
        model=_model(),
        tools=[calculator],
        instructions="You are solver.\nagl-tools: calculator",
    )
    return Team(
        name="planner",
        members=[solver],
        model=_model(),
        mode=TeamMode.broadcast,
        instructions="You are planner.\nagl-tools: delegate_task_to_members",
    )


def main(question: str) -> str:
    return str(build().run(question).content)


@agl.rollout  # agl
def solve(task: dict[str, Any], llm: agl.LLM) -> float:  # agl
    agl_otel.instrument()  # agl
    numbers = re.findall(r"-?\d+(?:\.\d+)?", main(task["question"]))  # agl
    return float(bool(numbers) and float(numbers[-1]) == float(task["answer"]))  # agl
