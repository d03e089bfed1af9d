"""Small agents that the end-to-end tests run in real worker processes (loaded as `tests/e2e_agents.py:NAME`)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import openai

import agl

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}


def _calculate(expression: str) -> str:
    left, plus, right = expression.partition("+")
    if not plus:
        raise ValueError(f"cannot evaluate {expression!r}")
    return str(int(left) + int(right))


@agl.rollout
def calc_agent(task: dict[str, Any], llm: agl.LLM) -> float:
    """planner asks for a tool call, the tool runs, answerer answers; two rewards: tool ok, final."""
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": task["question"]}]
    with agl.agent("planner"):
        first = client.chat.completions.create(model=llm.model, messages=messages, tools=[CALCULATOR])
    call = first.choices[0].message.tool_calls[0]
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    with agl.tool("calculator", call_id=call.id, arguments=call.function.arguments) as span:
        result = _calculate(json.loads(call.function.arguments)["expression"])
        span.set_attribute("agl.tool.result", result)
    agl.emit_reward(0.1, name="tool_ok")
    messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    with agl.agent("answerer"):
        stream = client.chat.completions.create(model=llm.model, messages=messages, stream=True)
        answer = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    return 1.0 if answer.strip().endswith(str(task["answer"])) else 0.0


@agl.rollout
async def slow_agent(task: dict[str, Any], llm: agl.LLM) -> float:
    """Makes one call, leaves a marker file, then sleeps the first time it sees a rollout: a test kills its
    worker during that sleep; the retried attempt finds the marker and finishes at once."""
    client = openai.AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    with agl.agent("sleeper"):
        await client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": "hi"}])
    rollout = agl.current_rollout()
    marker = Path(os.environ["AGL_TEST_MARKER_DIR"]) / rollout.rollout_id
    first_time = not marker.exists()
    marker.write_text(f"{os.getpid()} {rollout.attempt_id}")
    if first_time:
        await asyncio.sleep(float(task.get("sleep_s", 0)))
    agl.emit_reward(0.5, name="woke")
    return 1.0


@agl.rollout
def three_call_agent(task: dict[str, Any], llm: agl.LLM) -> None:
    """The agent of the end-to-end throughput benchmark: three LLM calls, then a reward."""
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    with agl.agent("worker"):
        for i in range(3):
            client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": f"step {i}"}])
    agl.emit_reward(1.0, name="done")


@agl.rollout
def failing_agent(task: dict[str, Any], llm: agl.LLM) -> float:
    raise RuntimeError(f"boom on {task['question']}")


@agl.rollout
def sleepy_sync_agent(task: dict[str, Any], llm: agl.LLM) -> float:
    time.sleep(float(task.get("sleep_s", 0)))
    return 1.0


@agl.rollout
def elsewhere_agent(task: dict[str, Any], llm: agl.LLM) -> float:
    """Calls the model server behind agl directly (`task["elsewhere"]`), as an app whose client ignores agl's URL
    does; with `task["intended"]` inside `agl.external_llm()` (a judge on purpose); with `task["through_agl"]` it
    also makes one call through agl; with `task["refused"]` the server elsewhere refuses it, and with
    `task["unreached"]` there is none (the app catches both errors and goes on)."""
    other = openai.OpenAI(base_url=task["elsewhere"], api_key="k", max_retries=0)
    with agl.agent("solver"):
        if task.get("intended"):
            with agl.external_llm():
                other.chat.completions.create(model="m", messages=[{"role": "user", "content": "judge"}])
        elif task.get("refused") or task.get("unreached"):
            text = "lost force_error:400" if task.get("refused") else "lost"
            try:
                other.chat.completions.create(model="m", messages=[{"role": "user", "content": text}])
            except openai.APIError:
                pass
        else:
            other.chat.completions.create(model="m", messages=[{"role": "user", "content": "lost"}])
        if task.get("through_agl"):
            llm.openai_client(max_retries=0).chat.completions.create(
                model=llm.model, messages=[{"role": "user", "content": "kept"}]
            )
    return 1.0
