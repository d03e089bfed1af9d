"""The Hermes tool format, the one rendering of tools and tool calls as text that agl uses everywhere: the
trainer's chat format (agl_trainer.chat_format, and the vLLM chat template generated from it) and the scripted
test backend (agl.testing.upstream) build prompts with these functions, so the two cannot drift apart.

    # Tools
    You can call these functions. Each is described by a JSON schema:
    <tools>
    {"type": "function", "function": {...}}            (one line per tool)
    </tools>
    To call a function, write <tool_call>{"name": "<function name>", "arguments": {<arguments>}}</tool_call>

Values are normalised the way vLLM hands a request to a chat template: the text parts of a message's content
are joined with newlines; a tool call's `arguments` are the JSON object they encode (anything that is not a JSON
object becomes `{}`); a tool is written as `{"type": "function", "function": {name, description, parameters,
strict}}` with only the fields that are set, in that order.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
TOOLS_INTRO = "# Tools\nYou can call these functions. Each is described by a JSON schema:\n<tools>\n"
TOOLS_OUTRO = (
    '\n</tools>\nTo call a function, write <tool_call>{"name": "<function name>", "arguments": {<arguments>}}'
    "</tool_call>"
)
CONTENT_PART_SEPARATOR = "\n"  # between the text parts of one message's content (vLLM's choice)
FUNCTION_FIELDS = ("name", "description", "parameters", "strict")  # what a tool's description keeps, in order


def message_text(content: Any) -> str:
    """A message's content as text: a string as it is, the text parts of OpenAI content parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return CONTENT_PART_SEPARATOR.join(
            p if isinstance(p, str) else str(p.get("text", ""))
            for p in content
            if isinstance(p, str) or (isinstance(p, dict) and p.get("type", "text") == "text")
        )
    return str(content)


def tool_arguments(arguments: Any) -> dict[str, Any]:
    """A tool call's arguments as the JSON object they encode; anything else (malformed JSON, a list, a number,
    nothing) as `{}`, which is what vLLM hands its chat template."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return {}
    return arguments if isinstance(arguments, dict) else {}


def render_tool_call(name: str, arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': tool_arguments(arguments)})}</tool_call>"


def render_tool_calls(message: dict[str, Any]) -> str:
    """The `<tool_call>` blocks of an assistant message's tool calls, in order."""
    return "".join(
        render_tool_call(
            str((call.get("function") or {}).get("name", "")), (call.get("function") or {}).get("arguments")
        )
        for call in message.get("tool_calls") or []
    )


def canonical_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool as vLLM validates it (`type` is always "function"), without the fields that are not set."""
    function = tool.get("function") or {}
    return {"type": "function", "function": {k: function[k] for k in FUNCTION_FIELDS if function.get(k) is not None}}


def tools_block(tools: Sequence[dict[str, Any]]) -> str:
    return TOOLS_INTRO + "\n".join(json.dumps(canonical_tool(t)) for t in tools) + TOOLS_OUTRO
