"""A CrewAI app with two agents: a planner that plans how to answer a question and reports the answer, and a solver
that computes it with its calculator tool, which raises on a division by zero. The crew runs its three tasks in
sequence (plan, solve, report). CrewAI's own telemetry is not OpenTelemetry of this kind;
`openinference-instrumentation-crewai` adds OpenInference spans (an AGENT span `<role>._execute_core` for each task
an agent runs, a TOOL span for each tool run), which agl_otel reads.

    CREWAI_DISABLE_TELEMETRY=true CREWAI_TRACING_ENABLED=false \\
        agl worker packages/otel-adapter/examples/crewai_openinference_crew.py:solve

The app itself is unchanged: its model comes from OPENAI_BASE_URL / OPENAI_API_KEY, which `agl worker` points at
the run. The lines agl needs are marked `# agl`. (agl's own CrewAI adapter, agl_crewai, needs no instrumentor; this
is the path of an app that already has CrewAI's OpenInference spans.)
"""

from __future__ import annotations

import re
from typing import Any

from crewai import LLM, Agent, Crew, Process, Task
from crewai.tools import tool
from openinference.instrumentation.crewai import CrewAIInstrumentor

import agl  # agl
import agl_otel  # agl

# once, when the worker loads the app: the instrumentor's already-instrumented check is not atomic, and rollouts run
# at once in threads would each wrap CrewAI again (every span twice)
CrewAIInstrumentor().instrument()  # agl: CrewAI's spans, unless the app already has them on


@tool("calculator")
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression of two integers, `<int> <op> <int>` with op one of + - * /."""
    found = re.fullmatch(r"\s*(-?\d+)\s*([+\-*/])\s*(-?\d+)\s*", expression)
    if found is None:
        raise ValueError(f"not an expression: {expression!r}")
    a, op, b = int(found[1]), found[2], int(found[3])
    return str({"+": a + b, "-": a - b, "*": a * b, "/": a / b if op == "/" else 0}[op])


def build() -> Crew:
    # the scripted test backend reads `agl-tools:` to know which tool to call; a real model reads the backstory
    model = LLM(model="openai/gpt-4o-mini")
    planner = Agent(
        role="planner",
        goal="Plan how to answer the question, then report the solver's answer.",
        backstory="You break questions into steps and report results plainly.",
        llm=model,
    )
    solver = Agent(
        role="solver",
        goal="Solve one arithmetic question with the calculator.",
        backstory="You never do arithmetic in your head.\nagl-tools: calculator",
        tools=[calculator],
        llm=model,
    )
    plan = Task(description="Plan how to answer: {question}", expected_output="A short plan.", agent=planner)
    solve = Task(description="Compute the answer to: {question}", expected_output="The number.", agent=solver)
    report = Task(
        description="Report the answer to: {question}",
        expected_output="One sentence with the number.",
        agent=planner,
        context=[solve],
    )
    return Crew(agents=[planner, solver], tasks=[plan, solve, report], process=Process.sequential)


def main(question: str) -> str:
    return str(build().kickoff(inputs={"question": question}))


@agl.rollout  # agl
def solve(task: dict[str, Any], llm: agl.LLM) -> float:  # agl
    agl_otel.instrument()  # agl
    numbers = re.findall(r"-?\d+(?:\.\d+)?", main(task["question"]))  # agl
    return float(bool(numbers) and float(numbers[-1]) == float(task["answer"]))  # agl
