"""Agents whose OpenAI clients are built once, at import time, against the run's fixed LLM URL — the way most
apps build them. `agl worker` sets AGL_LLM_BASE_URL before it imports this module."""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai

import agl

BASE_URL = os.environ["AGL_LLM_BASE_URL"]
# the user's own key: with a server token, agl sends the attempt's credential instead
SYNC_CLIENT = openai.OpenAI(base_url=BASE_URL, api_key="sk-the-users-own-key", max_retries=0)
ASYNC_CLIENT = openai.AsyncOpenAI(base_url=BASE_URL, api_key="sk-the-users-own-key", max_retries=0)
POOL = ThreadPoolExecutor(4)  # shared by every rollout of the worker, like an app's global pool


def _ask(model: str, text: str) -> str:
    answer = SYNC_CLIENT.chat.completions.create(model=model, messages=[{"role": "user", "content": text}])
    return answer.choices[0].message.content or ""


@agl.rollout
async def async_agent(task: dict[str, Any], llm: agl.LLM) -> float:
    """Two agents of one rollout, each with its own call, concurrently with the other rollouts of the worker."""
    i = task["i"]

    async def ask(agent: str) -> None:
        with agl.agent(f"{agent}-{i}"):
            await asyncio.sleep(0.01 * (i % 3))  # interleave the rollouts' calls
            await ASYNC_CLIENT.chat.completions.create(
                model=llm.model, messages=[{"role": "user", "content": f"rollout {i} {agent}"}]
            )

    await asyncio.gather(ask("planner"), ask("solver"))
    return 1.0


@agl.rollout
def thread_agent(task: dict[str, Any], llm: agl.LLM) -> float:
    """Calls made from a shared thread pool: `agl.propagate` carries the rollout and agent into the thread."""
    i = task["i"]
    with agl.agent(f"threaded-{i}"):
        futures = [POOL.submit(agl.propagate(_ask), llm.model, f"rollout {i} part {k}") for k in range(2)]
        for f in futures:
            f.result()
    return 1.0
