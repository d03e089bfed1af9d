"""A DSPy program as its docs write it: `dspy.LM` with DSPy's default answer cache (on disk and in memory), built at
import time, reading its base URL from the environment `agl worker` sets. Each rollout asks the same question."""

from __future__ import annotations

from typing import Any

import dspy

import agl

_lm = dspy.LM("openai/gpt-4o-mini", num_retries=0)  # cache=True: DSPy's default


@agl.rollout
def ask(task: Any, llm: agl.LLM) -> float:
    with agl.agent("solver"):
        answer = _lm("What is 2 + 2?")[0]
    return float(bool(answer))
