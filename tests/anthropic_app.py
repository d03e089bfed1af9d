"""An app written on Anthropic's SDK as its README shows: one client built at import time with neither a base URL nor
a key (it reads ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY, which `agl worker` sets). Only the decorator and the agent
scope are agl's."""

from __future__ import annotations

from typing import Any

import anthropic

import agl

CLIENT = anthropic.Anthropic(max_retries=0)


@agl.rollout
def ask(task: dict[str, Any], llm: agl.LLM) -> float:
    with agl.agent("asker"):
        answer = CLIENT.messages.create(
            model="claude-app-model", max_tokens=64, messages=[{"role": "user", "content": task["q"]}]
        )
    return 1.0 if answer.content and answer.content[0].type == "text" else 0.0
