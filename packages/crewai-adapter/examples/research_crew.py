"""A research crew that agl can train: a Researcher answers a question with a calculator, a Writer reports it.

Train the Writer only (the Researcher keeps running on the same model, but its calls are not trained):

    AGL_TRAIN_AGENTS=Writer agl train examples/research_crew.py:research_crew --tasks questions.jsonl

with one task a line, e.g. {"question": "What is 12 + 30?", "answer": 42}. `agl worker
examples/research_crew.py:research_crew --server URL` runs it as a worker of a running `agl serve`, and
`python examples/research_crew.py URL MODEL` runs one crew by hand against any OpenAI-compatible endpoint.
The lines marked `# agl` are all that agl adds to an ordinary CrewAI app.
"""

from __future__ import annotations

import ast
import operator
import os
import re
import sys
from typing import Any

# CrewAI's anonymous telemetry and trace upload are not wanted in training workers. (Never set
# OTEL_SDK_DISABLED: it would switch off agl's own tracing as well.)
os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")

from crewai import LLM, Agent, Crew, Process, Task
from crewai.tools import tool

import agl  # agl
import agl_crewai  # agl

agl_crewai.instrument()  # agl: each agent's LLM calls carry its role; each tool run becomes a span

_OPERATORS: dict[type[ast.AST], Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
}


def evaluate(expression: str) -> float:
    """Arithmetic on numbers only (no names, no calls): safe to run on what a model wrote."""

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return float(_OPERATORS[type(node.op)](value(node.left), value(node.right)))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return float(_OPERATORS[type(node.op)](value(node.operand)))
        raise ValueError(f"not an arithmetic expression: {expression!r}")

    return value(ast.parse(expression, mode="eval").body)


@tool("calculator")
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as 12*7 or (3+4)/2 and return the number."""
    result = evaluate(expression)  # raises on 1/0 or on text: CrewAI shows the model the error
    return str(int(result)) if result == int(result) else str(result)


def build_crew(llm: agl.LLM, *, stream: bool = False) -> Crew:
    """The crew, on the model `llm` points at; `stream=True` makes `kickoff` stream its output."""
    model = LLM(
        model=f"openai/{llm.model}",  # agl: the policy being trained, served by agl's proxy ...
        base_url=llm.base_url,  # agl: ... at this rollout's own URL
        api_key=llm.api_key,  # agl
    )
    researcher = Agent(
        role="Researcher",
        goal="Find the exact answer to the question, computing every number with the calculator.",
        backstory="You are meticulous and never do arithmetic in your head.",
        tools=[calculator],
        llm=model,
    )
    writer = Agent(
        role="Writer",
        goal="Report the researcher's answer in one clear sentence.",
        backstory="You write short, precise reports.",
        llm=model,
    )
    research = Task(
        description="Answer this question: {question}",
        expected_output="The exact number that answers the question.",
        agent=researcher,
    )
    report = Task(
        description="Write a one-sentence report that answers: {question}",
        expected_output="One sentence stating the number.",
        agent=writer,
        context=[research],
    )
    return Crew(agents=[researcher, writer], tasks=[research, report], process=Process.sequential, stream=stream)


def score(report: str, answer: float) -> float:
    """1 when the report states the right number, else 0."""
    numbers = re.findall(r"-?\d+(?:\.\d+)?", report.replace(",", ""))
    return 1.0 if any(abs(float(n) - float(answer)) < 1e-6 for n in numbers) else 0.0


@agl.rollout  # agl
def research_crew(task: dict[str, Any], llm: agl.LLM) -> float:
    """One rollout: `task` is {"question": "What is 12 + 30?", "answer": 42}; the reward checks the report."""
    crew = build_crew(llm)
    result = crew.kickoff(inputs={"question": task["question"]})
    return score(result.raw, task["answer"])


if __name__ == "__main__":  # one crew by hand, without agl: python research_crew.py http://localhost:8000/v1 MODEL
    endpoint = agl.LLM(base_url=sys.argv[1], model=sys.argv[2], api_key=os.environ.get("OPENAI_API_KEY", "none"))
    print("reward", research_crew({"question": "What is 12 + 30?", "answer": 42}, endpoint))
