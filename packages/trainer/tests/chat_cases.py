"""Conversations that exercise every rule of agl's chat rendering (tools, tool calls with non-ASCII and malformed
arguments, tool results, several system messages, content parts, the developer role), shared by the template's
unit tests and by tests/test_vllm_engine.py, which sends them to a real vLLM server."""

from __future__ import annotations

import copy
from typing import Any

from agl_trainer.chat_format import tool_arguments

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression – with ünïcode",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}, "strict": True}}
BARE = {"type": "function", "function": {"name": "now"}}  # no description, no parameters


def call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


CONVERSATIONS: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = {
    "tools, no system message": ([{"role": "user", "content": "What is 2+3?"}], [CALCULATOR]),
    "tools join the system message": (
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        [CALCULATOR, SEARCH, BARE],
    ),
    "an empty system message": ([{"role": "system", "content": ""}, {"role": "user", "content": "hi"}], [SEARCH]),
    "two system messages": (
        [
            {"role": "system", "content": "First."},
            {"role": "user", "content": "hi"},
            {"role": "system", "content": "Second, later."},
            {"role": "user", "content": "again"},
        ],
        [CALCULATOR],
    ),
    "tool calls and results": (
        [
            {"role": "system", "content": "Use the calculator."},
            {"role": "user", "content": "What is 12 * 34?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [call("c1", "calculator", '{"expression": "12 * 34"}')],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "408"},
            {"role": "assistant", "content": "The answer is 408."},
            {"role": "user", "content": "And 71 + 19?"},
        ],
        [CALCULATOR],
    ),
    "non-ASCII arguments, several calls, text before them": (
        [
            {"role": "user", "content": "Look these up."},
            {
                "role": "assistant",
                "content": "Let me check.",
                "tool_calls": [
                    call(
                        "c1",
                        "search",
                        '{"query": "Zürich → Genève ✓ 😀", "limit": 1.5e3, "nested": {"b": 1, "a": [1]}}',
                    ),
                    call("c2", "calculator", '{"expression": "2+3"}'),
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "Genève: 😀"},
            {"role": "tool", "tool_call_id": "c2", "content": "5"},
        ],
        [SEARCH, CALCULATOR],
    ),
    "arguments that are not a JSON object": (
        [
            {"role": "user", "content": "x"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    call("c1", "search", "not json"),
                    call("c2", "search", "[1, 2]"),
                    call("c3", "search", ""),
                ],
            },
        ],
        [SEARCH],
    ),
    "content parts, developer and tool roles": (
        [
            {"role": "developer", "content": "Developer note."},
            {"role": "user", "content": [{"type": "text", "text": "Part one."}, {"type": "text", "text": "Part two."}]},
            {"role": "assistant", "content": None, "tool_calls": [call("c1", "now", "{}")]},
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "12:00"}]},
        ],
        [BARE],
    ),
    "no tools at all": ([{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}], None),
}


def as_vllm_passes_it(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """vLLM 0.32's view of a request (string content format): text parts joined with newlines, None content as
    "", tool-call arguments parsed into an object ({} when they are not one), tools as its pydantic model dumps
    them (description/parameters None when absent, strict only when set)."""
    out = copy.deepcopy(messages)
    for message in out:
        content = message.get("content")
        if content is None:
            message["content"] = ""
        elif isinstance(content, list):
            message["content"] = "\n".join(p["text"] for p in content)
        for tc in message.get("tool_calls") or []:
            tc["function"]["arguments"] = tool_arguments(tc["function"]["arguments"])
    if tools is None:
        return out, None
    dumped = []
    for tool in tools:
        fn = tool["function"]
        function = {"name": fn["name"], "description": fn.get("description"), "parameters": fn.get("parameters")}
        if fn.get("strict") is not None:
            function["strict"] = fn["strict"]
        dumped.append({"type": "function", "function": function})
    return out, dumped
