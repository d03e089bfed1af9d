"""A research crew that agl can train: a Researcher answers a question with a calculator, a Writer reports it.

Train it (the Writer only, say) with agl workers running this function:

    AGL_TRAIN_AGENTS=Writer agl train ... --agent examples/research_crew.py:research_crew

or run one rollout by hand against any OpenAI-compatible endpoint with `python examples/research_crew.py URL`.
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

from crewai import LLM, Agent, Crew, Process, Task  # noqa: E402
from crewai.tools import tool  # noqa: E402

import agl  # noqa: E402  # agl
import agl_crewai  # noqa: E402  # agl

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


def build_crew(llm: agl.LLM, *, stream: bool = False, researcher_notes: str = "", writer_notes: str = "") -> Crew:
    """The crew. `*_notes` are appended to an agent's backstory (agl's tests use them to script a fake model)."""
    model = LLM(
        model=f"openai/{llm.model}",  # agl: the policy being trained, served by agl's proxy ...
        base_url=llm.base_url,  # agl: ... at this rollout's own URL
        api_key=llm.api_key,  # agl
        stream=stream,
        temperature=0.7,
    )
    researcher = Agent(
        role="Researcher",
        goal="Find the exact answer to the question, computing every number with the calculator.",
        backstory=f"You are meticulous and never do arithmetic in your head. {researcher_notes}".strip(),
        tools=[calculator],
        llm=model,
    )
    writer = Agent(
        role="Writer",
        goal="Report the researcher's answer in one clear sentence.",
        backstory=f"You write short, precise reports. {writer_notes}".strip(),
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
    crew = build_crew(llm, researcher_notes=task.get("researcher_notes", ""), writer_notes=task.get("writer_notes", ""))
    result = crew.kickoff(inputs={"question": task["question"]})
    return score(result.raw, task["answer"])


if __name__ == "__main__":  # one rollout by hand, outside agl: `python research_crew.py http://localhost:8000/v1 MODEL`
    endpoint = agl.LLM(base_url=sys.argv[1], model=sys.argv[2] if len(sys.argv) > 2 else "gpt-4o-mini")
    print(research_crew({"question": "What is 12 + 30?", "answer": 42}, endpoint))
