"""The `ToolMessage`s inside what a LangGraph node received or returned.

A ToolNode answers some tool calls without running any tool: a tool name the model made up, a failing
`wrap_tool_call` interceptor. LangChain reports no tool run for those; the only trace is a `ToolMessage` with
`status="error"` in the node's output, which the handler turns into an error tool span.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from langchain_core.messages import ToolMessage

# Node inputs and outputs are state dicts, lists of messages, or `Command(update=...)`; deeper nesting is data.
_MAX_DEPTH = 4


def tool_messages(value: Any, _depth: int = 0) -> Iterator[ToolMessage]:
    if isinstance(value, ToolMessage):
        yield value
    elif _depth >= _MAX_DEPTH:
        return
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from tool_messages(item, _depth + 1)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tool_messages(item, _depth + 1)
    elif isinstance(update := getattr(value, "update", None), (Mapping, list, tuple)):  # langgraph's Command
        yield from tool_messages(update, _depth + 1)


def answered_call_ids(value: Any) -> set[str]:
    """The tool calls that already have an answer in `value` (a node's input: the conversation so far)."""
    return {m.tool_call_id for m in tool_messages(value)}


def text_of(message: ToolMessage) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    return "".join(p if isinstance(p, str) else str(p.get("text", "")) for p in content)
