"""The agent `bench_ray_workers.py` runs on the cluster's workers: one recorded call, then a wait of the task's
`wait_s` (what a tool run or a test takes), reward 1."""

from __future__ import annotations

import time
from typing import Any

import agl


@agl.rollout
def one_call(task: Any, llm: agl.LLM) -> float:
    client = llm.openai_client(max_retries=0)
    with agl.agent("solver"):
        client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": str(task)}])
    time.sleep(float(task.get("wait_s", 0)))
    return 1.0
