"""A DSPy program whose answer is judged by a second call that no agent scope names (a ChainOfThought judge beside
a named agent, in miniature): some of the rollout's calls are attributed, one is not."""

from __future__ import annotations

from typing import Any

import dspy

import agl

_lm = dspy.LM("openai/gpt-4o-mini", cache=False, num_retries=0)


@agl.rollout
def solve(task: Any, llm: agl.LLM) -> float:
    with agl.agent("solver"):
        answer = _lm("What is 2 + 2?")[0]
    verdict = _lm(f"Is this right? {answer}")[0]  # the judge: under no agent
    return float(bool(verdict))
