"""Chat messages (with tools) → the prompt text the engine feeds the model, and generated text → an OpenAI
assistant message (with tool calls).

Tool format. Models whose chat template takes `tools` (Qwen, Llama 3.1, ...) get them natively. For the others,
SmolLM2 included, the tools are described in the system message in the Hermes style most small instruct models
have seen:

    # Tools
    You can call these functions. Each is described by a JSON schema:
    <tools>
    {"type": "function", "function": {...}}            (one line per tool)
    </tools>
    To call a function, write <tool_call>{"name": "<function name>", "arguments": {<arguments>}}</tool_call>

An assistant message that called tools is rendered with the same `<tool_call>...</tool_call>` blocks after its
text; tool results are messages of role `tool`. When parsing, every `<tool_call>` block must hold a JSON object
with a known function `name` and object `arguments`; if any block is malformed, the whole answer is returned as
plain text (finish reason `stop`), never a crash and never a half-parsed call.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
TOOLS_HEADER = (
    "# Tools\nYou can call these functions. Each is described by a JSON schema:\n<tools>\n{tools}\n</tools>\n"
    'To call a function, write <tool_call>{{"name": "<function name>", "arguments": {{<arguments>}}}}</tool_call>'
)


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: the text ones
        return "".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type", "text") == "text"
        )
    return str(content)


def render_tool_call(name: str, arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def tools_block(tools: Sequence[dict[str, Any]]) -> str:
    return TOOLS_HEADER.format(tools="\n".join(json.dumps(t) for t in tools))


def supports_native_tools(tokenizer: Any) -> bool:
    template = getattr(tokenizer, "chat_template", None) or ""
    return isinstance(template, str) and "tools" in template


def to_template_messages(
    messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None
) -> list[dict[str, str]]:
    """OpenAI messages → plain `{role, content}` messages with tools and tool calls written out as text."""
    out: list[dict[str, str]] = []
    for message in messages:
        text = _text(message.get("content"))
        for call in message.get("tool_calls") or []:
            fn = call.get("function") or {}
            text += render_tool_call(str(fn.get("name", "")), fn.get("arguments", {}))
        out.append({"role": str(message.get("role", "user")), "content": text})
    if tools:
        block = tools_block(tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{block}" if out[0]["content"] else block}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def render_prompt(
    tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
) -> str:
    """The exact prompt text for a chat request, ending with the assistant turn's opening."""
    if not messages:
        raise ValueError("a chat request needs at least one message")
    if tools and supports_native_tools(tokenizer):
        return str(
            tokenizer.apply_chat_template(list(messages), tools=list(tools), add_generation_prompt=True, tokenize=False)
        )
    return str(
        tokenizer.apply_chat_template(to_template_messages(messages, tools), add_generation_prompt=True, tokenize=False)
    )


@dataclass
class ParsedAnswer:
    content: str | None
    tool_calls: list[dict[str, Any]]
    malformed_tool_call: bool = False

    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return msg


def parse_answer(text: str, tools: Sequence[dict[str, Any]] | None) -> ParsedAnswer:
    """Split generated text into content and OpenAI tool calls (only when tools were offered)."""
    blocks = TOOL_CALL.findall(text) if tools else []
    if not blocks:
        malformed = bool(tools) and "<tool_call>" in text
        return ParsedAnswer(text, [], malformed_tool_call=malformed)
    known = {str((t.get("function") or {}).get("name")) for t in tools or []}
    calls: list[dict[str, Any]] = []
    for block in blocks:
        try:
            parsed = json.loads(block)
        except json.JSONDecodeError:
            return ParsedAnswer(text, [], malformed_tool_call=True)
        if not isinstance(parsed, dict) or parsed.get("name") not in known:
            return ParsedAnswer(text, [], malformed_tool_call=True)
        arguments = parsed.get("arguments", {})
        if not isinstance(arguments, dict):
            return ParsedAnswer(text, [], malformed_tool_call=True)
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": parsed["name"], "arguments": json.dumps(arguments)},
            }
        )
    rest = TOOL_CALL.sub("", text).strip()
    return ParsedAnswer(rest or None, calls)
