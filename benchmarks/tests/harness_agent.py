"""A small agent for the harness tests: asks the model to echo the question, scores 1 when it does, and fails
outright for questions that say `crash` (a rollout that ends without an outcome)."""

from __future__ import annotations

import time
from typing import Any

import agl
from agl_bench.results import report


@agl.rollout
def solve(task: dict[str, Any], llm: agl.LLM) -> float:
    time.sleep(float(task.get("sleep_s", 0)))
    if "crash" in task["question"]:
        raise RuntimeError("the agent crashed")
    with agl.agent("echoer"):
        reply = llm.openai_client().chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": task["question"]}], max_tokens=32
        )
    answer = reply.choices[0].message.content or ""
    exact = float(answer == f"Echo: {task['answer']}")
    report(
        {"exact": exact, "length": len(answer) / 100}, prediction=answer, gold=task["answer"], upper=task.get("upper")
    )
    return exact
