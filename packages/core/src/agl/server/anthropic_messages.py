"""The Anthropic Messages API (`POST .../v1/messages`) on agl's LLM proxy, served through chat completions.

A Messages request is translated into the chat-completions request it means (`system` → a system message,
`tool_use` blocks → an assistant's tool calls, `tool_result` blocks → tool messages, `tools` with their
`input_schema` → function tools, `stop_sequences` → `stop`), sent through the proxy's chat path, and the chat answer
is translated back into a Messages object. The call is therefore recorded exactly like a chat completion — the same
exact prompt and response token ids, the same log-probs, the same agent attribution — under the route `messages`.
Why not forward to the backend's own `/v1/messages`: agl's embedded engine has none, and vLLM's (0.32, read in its
source: `vllm/entrypoints/anthropic/serving.py`) translates to its chat path itself without `return_token_ids` or
log-probs in what it returns, so a call made there could not be trained on.

Streaming: the backend is asked for the whole answer, which is then sent as the Messages event sequence
(`message_start`, each content block's start, one delta and stop, `message_delta`, `message_stop`), so a streaming
client (the `anthropic` SDK's `messages.stream`, Claude Code) works unchanged; it sees the answer when it is
complete, not token by token. Images, documents and server tools are refused with a 400 that names them; a
`thinking` block of an earlier turn is left out of the prompt (a chat model is not shown it either).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import orjson


class MessagesRequestError(ValueError):
    """A Messages request the proxy cannot translate; the message says what and why."""


_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use"}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "request_too_large",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
}


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    """A message's content as a list of blocks (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise MessagesRequestError(
            f"{where}: content must be a string or a list of blocks, got {type(content).__name__}"
        )
    for i, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise MessagesRequestError(f"{where}: content block {i} is not an object with a type")
    return content


def _text_of(blocks: list[dict[str, Any]], where: str) -> str:
    """The text of text blocks (a tool result's content, a system prompt)."""
    texts = []
    for i, block in enumerate(blocks):
        if block["type"] != "text":
            raise MessagesRequestError(
                f"{where}: block {i} of type {block['type']!r} is not supported by agl's proxy (text only)"
            )
        texts.append(str(block.get("text", "")))
    return "".join(texts)


def _turn(message: Any, i: int) -> list[dict[str, Any]]:
    """The chat messages of one Messages turn: a user turn's tool results come first, as tool messages."""
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant", "system"):
        raise MessagesRequestError(f"messages[{i}] must be an object with role 'user', 'assistant' or 'system'")
    role = message["role"]
    if role == "system":  # a system message between turns (Claude Code sends its environment so): text only
        where = f"messages[{i}]"
        return [{"role": "system", "content": _text_of(_blocks(message.get("content", ""), where), where)}]
    blocks = _blocks(message.get("content", ""), f"messages[{i}]")
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        kind = block["type"]
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use" and role == "assistant":
            arguments = block.get("input", {})
            calls.append(
                {
                    "id": block.get("id") or _new_id("toolu"),
                    "type": "function",
                    "function": {"name": block.get("name", ""), "arguments": json.dumps(arguments, ensure_ascii=False)},
                }
            )
        elif kind == "tool_result" and role == "user":
            result = block.get("content", "")
            text = result if isinstance(result, str) else _text_of(_blocks(result, f"messages[{i}].content[{j}]"), "")
            out.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text})
        elif kind in ("thinking", "redacted_thinking"):
            continue  # an earlier turn's reasoning: not part of the prompt the chat model sees
        else:
            raise MessagesRequestError(
                f"messages[{i}].content[{j}] of type {kind!r} is not supported by agl's proxy in a {role} turn"
                " (text, tool_use and tool_result blocks are)"
            )
    if role == "assistant":
        turn: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
        if calls:
            turn["tool_calls"] = calls
        return [turn]
    if texts:
        out.append({"role": "user", "content": "".join(texts)})
    return out


def _tool(tool: Any, i: int) -> dict[str, Any]:
    if not isinstance(tool, dict) or not tool.get("name"):
        raise MessagesRequestError(f"tools[{i}] must be an object with a name")
    if tool.get("type") not in (None, "custom"):
        raise MessagesRequestError(
            f"tools[{i}] of type {tool['type']!r} (a server tool) is not supported by agl's proxy: only tools with an"
            " input_schema reach the model"
        )
    function: dict[str, Any] = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object"}}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> Any:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "auto":
        return "auto"
    if kind == "any":
        return "required"
    if kind == "none":
        return "none"
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise MessagesRequestError(f"tool_choice {choice!r} is not one of auto, any, tool, none")


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat-completions request a Messages request means (not streamed: see the module docstring)."""
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise MessagesRequestError("messages must be a non-empty list")
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": _text_of(_blocks(system, "system"), "system")})
    for i, message in enumerate(raw_messages):
        messages.extend(_turn(message, i))
    chat: dict[str, Any] = {"messages": messages}
    for field in ("model", "temperature", "top_p", "top_k"):
        if body.get(field) is not None:
            chat[field] = body[field]
    if body.get("max_tokens") is not None:
        chat["max_tokens"] = body["max_tokens"]
    if body.get("stop_sequences"):
        chat["stop"] = body["stop_sequences"]
    tools = [_tool(t, i) for i, t in enumerate(body.get("tools") or [])]
    if tools:
        chat["tools"] = tools
        if body.get("tool_choice") is not None:
            chat["tool_choice"] = _tool_choice(body["tool_choice"])
    return chat


def from_chat(answer: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """The Messages object of a chat-completions answer to the request `to_chat` made of `request`."""
    choice = (answer.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        try:
            arguments = json.loads(fn.get("arguments") or "{}")
        except ValueError:
            arguments = {}  # the model wrote no JSON: the agent sees an empty input, the store the model's text
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id") or _new_id("toolu"),
                "name": fn.get("name", ""),
                "input": arguments if isinstance(arguments, dict) else {"value": arguments},
            }
        )
    usage = answer.get("usage") or {}
    stop_reason = _STOP_REASONS.get(str(choice.get("finish_reason")), "end_turn")
    stop_sequence = None
    if stop_reason == "end_turn" and request.get("stop_sequences") and isinstance(choice.get("stop_reason"), str):
        stop_reason, stop_sequence = "stop_sequence", choice["stop_reason"]  # vLLM names the stop string it met
    return {
        "id": _new_id("msg"),
        "type": "message",
        "role": "assistant",
        "model": answer.get("model") or request.get("model") or "",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": {
            "input_tokens": int(usage.get("prompt_tokens", 0)),
            "output_tokens": int(usage.get("completion_tokens", 0)),
        },
    }


def stream_events(message: dict[str, Any]) -> Iterator[bytes]:
    """The server-sent events of a finished Messages object, in the order Anthropic's API sends them."""

    def event(kind: str, **fields: Any) -> bytes:
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **fields}) + b"\n\n"

    opening = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    opening["usage"] = {"input_tokens": message["usage"]["input_tokens"], "output_tokens": 0}
    yield event("message_start", message=opening)
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            yield event("content_block_start", index=index, content_block={"type": "text", "text": ""})
            yield event("content_block_delta", index=index, delta={"type": "text_delta", "text": block["text"]})
        else:
            yield event("content_block_start", index=index, content_block={**block, "input": {}})
            partial = json.dumps(block["input"], ensure_ascii=False)
            yield event("content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": partial})
        yield event("content_block_stop", index=index)
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
    yield event("message_delta", delta=delta, usage={"output_tokens": message["usage"]["output_tokens"]})
    yield event("message_stop")


def error_body(status: int, message: str) -> bytes:
    """An error in Anthropic's envelope, which its SDKs raise with the message."""
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})
