"""A chat-completions answer (or a streamed chunk) read without trusting its shape: what the translated APIs
(agl.server.anthropic_messages, agl.server.responses) take from it."""

from __future__ import annotations

import math
from typing import Any


def obj(value: Any) -> dict[str, Any]:
    """`value` where it is an object, else an empty one: an upstream's answer is read without trusting its shape."""
    return value if isinstance(value, dict) else {}


def first_choice(answer: dict[str, Any]) -> dict[str, Any]:
    """The answer's (or chunk's) choice 0, as the proxy records it; {} where it has none."""
    choices = answer.get("choices")
    return (
        next((c for c in choices if isinstance(c, dict) and c.get("index", 0) == 0), {})
        if isinstance(choices, list)
        else {}
    )


def usage_tokens(usage: Any, key: str) -> int:
    """A token count of a chat answer's usage; 0 where the backend gave none or no number (`null`, a string)."""
    value = usage.get(key) if isinstance(usage, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return 0
    return int(value)
