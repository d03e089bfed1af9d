"""The agent the Ray workers test runs: one recorded call, then a pause, so that rollouts are in flight when a
worker is killed; the reward is 1."""

from __future__ import annotations

import time
from typing import Any

import agl


@agl.rollout
def slow(task: Any, llm: agl.LLM) -> float:
    client = llm.openai_client(max_retries=0)
    with agl.agent("solver"):
        client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": str(task)}])
    time.sleep(1.0)
    return 1.0
