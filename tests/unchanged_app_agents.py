"""An app as its authors wrote it: one OpenAI client built at import time with neither a base URL nor a key, so
the SDK reads OPENAI_BASE_URL and OPENAI_API_KEY. Only the decorator and the agent scope are agl's."""

from __future__ import annotations

from typing import Any

import openai

import agl

CLIENT = openai.OpenAI(max_retries=0)  # as in the SDK's README


@agl.rollout
def ask(task: dict[str, Any], llm: agl.LLM) -> float:
    with agl.agent("asker"):
        answer = CLIENT.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": task["q"]}])
    return 1.0 if answer.choices[0].message.content else 0.0
