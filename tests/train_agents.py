"""Agents for the training end-to-end tests (loaded by worker processes as `tests/train_agents.py:NAME`)."""

from __future__ import annotations

import random
from typing import Any

import agl


@agl.rollout
def parity_agent(task: Any, llm: agl.LLM) -> float:
    """One sampled answer; the reward depends on the sample (even length → 1), so a group of rollouts of the
    same task disagrees and GRPO has something to push on. An intermediate reward comes first."""
    client = llm.openai_client(max_retries=0)
    with agl.agent("speaker"):
        reply = client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": str(task)}], max_tokens=6
        )
    agl.emit_reward(0.1, name="answered")
    return float(len(reply.choices[0].message.content or "") % 2 == 0)


def _speaker_and_listener(task: Any, llm: agl.LLM) -> str:
    """A speaker samples an answer and a listener repeats it; the speaker's text."""
    client = llm.openai_client(max_retries=0)
    with agl.agent("speaker"):
        said = client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": str(task)}], max_tokens=6
        )
    text = said.choices[0].message.content or ""
    with agl.agent("listener"):
        client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": text}], max_tokens=4)
    return text


@agl.rollout
def duo_agent(task: Any, llm: agl.LLM) -> float:
    """Two agents, one call each: a speaker samples an answer and a listener repeats it. The reward depends on
    the speaker's sample, as in `parity_agent`."""
    return float(len(_speaker_and_listener(task, llm)) % 2 == 0)


@agl.rollout
def graded_duo_agent(task: Any, llm: agl.LLM) -> float:
    """`duo_agent` with a reward that differs within every group (a draw from [0, 1)): every step has advantages
    to train on, so a test of what an update reports never meets a step whose groups all agree (with parity
    rewards from a tiny random model, a step of two groups of four did now and then, and trained on nothing)."""
    _speaker_and_listener(task, llm)
    return random.random()


@agl.rollout
def greedy_agent(task: Any, llm: agl.LLM) -> float:
    """`parity_agent` sending its call greedily and truncated, as Aider and BeeAI do (`temperature: 0`, top-p)."""
    client = llm.openai_client(max_retries=0)
    with agl.agent("speaker"):
        reply = client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": str(task)}], max_tokens=6, temperature=0, top_p=0.9
        )
    return float(len(reply.choices[0].message.content or "") % 2 == 0)
