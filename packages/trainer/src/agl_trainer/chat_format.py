"""Chat messages (with tools) → the prompt text the engine feeds the model, and generated text → an OpenAI
assistant message (with tool calls).

Tool format. Models whose chat template takes `tools` (Qwen, Llama 3.1, ...) get them natively. For the others,
SmolLM2 included, the tools are described in the system message in the Hermes style most small instruct models
have seen, rendered by `agl.common.hermes` (shared with the scripted test backend, normalised as vLLM normalises a
request): an assistant message that called tools is rendered with `<tool_call>...</tool_call>` blocks after its
text; tool results are messages of role `tool`. When parsing, every `<tool_call>` block must hold a JSON object
with a known function `name` and object `arguments`; if any block is malformed, the whole answer is returned as
plain text (finish reason `stop`), never a crash and never a half-parsed call. A vLLM server started with
`engine_chat_template(tokenizer)` builds the very same prompt.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agl.common.hermes import (
    CONTENT_PART_SEPARATOR,
    FUNCTION_FIELDS,
    TOOL_CALL,
    TOOLS_INTRO,
    TOOLS_OUTRO,
    canonical_tool,
    message_text,
    render_tool_call,
    render_tool_calls,
    tool_arguments,
    tools_block,
)

__all__ = [
    "CONTENT_PART_SEPARATOR",
    "FUNCTION_FIELDS",
    "TOOL_CALL",
    "TOOLS_INTRO",
    "TOOLS_OUTRO",
    "ParsedAnswer",
    "canonical_tool",
    "engine_chat_template",
    "parse_answer",
    "render_prompt",
    "render_tool_call",
    "supports_native_tools",
    "to_template_messages",
    "tool_arguments",
    "tools_block",
]


def supports_native_tools(tokenizer: Any) -> bool:
    template = getattr(tokenizer, "chat_template", None) or ""
    return isinstance(template, str) and "tools" in template


def to_template_messages(
    messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None
) -> list[dict[str, str]]:
    """OpenAI messages → plain `{role, content}` messages with tools and tool calls written out as text."""
    out: list[dict[str, str]] = []
    for message in messages:
        text = message_text(message.get("content")) + render_tool_calls(message)
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


# ------------------------------------------------------------------------------------------------------------------
# The same rendering as a Jinja chat template, for an engine that builds prompts itself (vLLM's --chat-template).


def _jinja_literal(text: str) -> str:
    """`text` as a Jinja string literal (Jinja un-escapes literals with Python's unicode-escape codec)."""
    return "'" + text.encode("unicode-escape").decode("ascii").replace("'", "\\'") + "'"


# Rebuilds `messages` as `to_template_messages` does, then hands them to the model's own template. It expects
# what vLLM passes a template: tool-call `arguments` already parsed into objects (a JSON string is refused, not
# guessed at) and tools in vLLM's shape. Every value that outlives a loop iteration lives in the namespace `agl`:
# a plain `set` inside a Jinja loop is local to it, and would silently drop the tool calls it appended.
# The word 'developer' below also keeps vLLM from turning developer messages into system ones, which agl's
# rendering does not do.
_PREAMBLE = """{#- agl_trainer.chat_format: tools and tool calls as agl renders them; 'developer' and every other role kept -#}
{%- set agl = namespace(messages=[], text='', parts=[], pairs=[], lines=[]) -%}
{%- for message in messages -%}
{%- set content = message.get('content') -%}
{%- if content is none -%}
{%- set agl.text = '' -%}
{%- elif content is string -%}
{%- set agl.text = content -%}
{%- elif content is iterable and content is not mapping -%}
{%- set agl.parts = [] -%}
{%- for part in content -%}
{%- if part is string -%}
{%- set agl.parts = agl.parts + [part] -%}
{%- elif part is mapping and part.get('type', 'text') == 'text' -%}
{%- set agl.parts = agl.parts + [part.get('text', '') | string] -%}
{%- endif -%}
{%- endfor -%}
{%- set agl.text = agl.parts | join(SEPARATOR) -%}
{%- else -%}
{%- set agl.text = content | string -%}
{%- endif -%}
{%- for call in message.get('tool_calls') or [] -%}
{%- set function = call.get('function') or {} -%}
{%- set arguments = function.get('arguments') -%}
{%- if arguments is string -%}
{{- raise_exception('agl chat template: tool-call arguments must arrive parsed into an object, as vLLM passes them') -}}
{%- endif -%}
{%- set call_json = {'name': function.get('name', '') | string, 'arguments': arguments if arguments is mapping else {}} -%}
{%- set agl.text = agl.text + '<tool_call>' + (call_json | tojson(ensure_ascii=True)) + '</tool_call>' -%}
{%- endfor -%}
{%- set agl.messages = agl.messages + [{'role': message.get('role', 'user') | string, 'content': agl.text}] -%}
{%- endfor -%}
{%- if tools -%}
{%- set agl.lines = [] -%}
{%- for tool in tools -%}
{%- set function = tool.get('function') or {} -%}
{%- set agl.pairs = [] -%}
{%- for key in FIELDS -%}
{%- if function.get(key) is not none -%}
{%- set agl.pairs = agl.pairs + [[key, function[key]]] -%}
{%- endif -%}
{%- endfor -%}
{%- set agl.lines = agl.lines + [{'type': 'function', 'function': dict(agl.pairs)} | tojson(ensure_ascii=True)] -%}
{%- endfor -%}
{%- set block = INTRO + (agl.lines | join('\\n')) + OUTRO -%}
{%- if agl.messages and agl.messages[0]['role'] == 'system' -%}
{%- set first = agl.messages[0]['content'] -%}
{%- set agl.messages = [{'role': 'system', 'content': (first + '\\n\\n' + block) if first else block}] + agl.messages[1:] -%}
{%- else -%}
{%- set agl.messages = [{'role': 'system', 'content': block}] + agl.messages -%}
{%- endif -%}
{%- endif -%}
{%- set messages = agl.messages %}"""


def engine_chat_template(tokenizer: Any) -> str | None:
    """A Jinja chat template that renders every request exactly as `render_prompt(tokenizer, ...)` does, when
    given what vLLM gives a template; built from this module's constants around the tokenizer's own template.
    None when the tokenizer's template renders tools itself (then both use that template as it is)."""
    if supports_native_tools(tokenizer):
        return None
    base = getattr(tokenizer, "chat_template", None)
    if not isinstance(base, str) or not base:
        raise ValueError("the tokenizer has no chat template to build on")
    constants = {
        "SEPARATOR": _jinja_literal(CONTENT_PART_SEPARATOR),
        "FIELDS": "[" + ", ".join(_jinja_literal(f) for f in FUNCTION_FIELDS) + "]",
        "INTRO": _jinja_literal(TOOLS_INTRO),
        "OUTRO": _jinja_literal(TOOLS_OUTRO),
    }
    preamble = re.sub(r"\b(SEPARATOR|FIELDS|INTRO|OUTRO)\b", lambda match: constants[match.group(1)], _PREAMBLE)
    return preamble + base
