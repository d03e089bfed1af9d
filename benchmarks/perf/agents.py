"""The agent of the end-to-end benchmark (loaded by `agl worker benchmarks/perf/agents.py:three_calls`)."""

from __future__ import annotations

from typing import Any

import openai

import agl


async def _three_calls(client: openai.AsyncOpenAI, task: Any, llm: agl.LLM) -> None:
    messages: list[Any] = [{"role": "user", "content": f"task {task}"}]
    with agl.agent("worker"):
        for _ in range(3):
            resp = await client.chat.completions.create(model=llm.model, messages=messages, max_tokens=16)
            messages.append({"role": "assistant", "content": resp.choices[0].message.content})
            messages.append({"role": "user", "content": "go on"})
    agl.emit_reward(1.0, name="done")


@agl.rollout
async def three_calls(task: Any, llm: agl.LLM) -> None:
    """Three LLM calls through the proxy in an agent scope, then a reward: the shape of a small real agent.
    Its client comes from `llm.async_openai_client()`, which shares the process's connection pool."""
    await _three_calls(llm.async_openai_client(max_retries=0), task, llm)


@agl.rollout
async def three_calls_fresh_client(task: Any, llm: agl.LLM) -> None:
    """The same agent building a new `openai.AsyncOpenAI` for every rollout, as naive agent code does."""
    await _three_calls(openai.AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0), task, llm)
