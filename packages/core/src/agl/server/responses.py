"""The OpenAI Responses API (`POST .../v1/responses`) on agl's LLM proxy, served through chat completions.

A Responses request is translated into the chat-completions request it means (instructions → a system message,
input items → messages, `function_call` / `function_call_output` items → assistant tool calls / tool messages,
function tools → chat tools), sent through the proxy's chat path, and the chat answer is translated back. The
call is therefore recorded exactly like a chat completion — the same exact prompt and response token ids, the
same log-probs, the same agent attribution — and everything downstream (transitions, credit, training) is
unchanged. Why not forward to the backend's own `/v1/responses`: agl's embedded engine has none, and vLLM's
(0.32, read in its source) has no `return_token_ids`; its `enable_response_messages` returns the raw token
messages only for non-streamed requests and is built for harmony-format models (gpt-oss), so a call made there
could not be trained on in general. Chat completions return the prompt and sampled ids with their log-probs from
every backend agl supports, streamed or not.

Streaming: the backend is asked for the whole answer, which is then sent as the Responses event sequence (one
text delta, or one arguments delta per tool call), so a streaming client (the OpenAI Agents SDK's
`Runner.run_streamed`) works unchanged; it sees the answer when it is complete, not token by token.
`previous_response_id` (server-side conversation state) is refused: the proxy keeps no responses.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import orjson


class ResponsesRequestError(ValueError):
    """A Responses request the proxy cannot translate; the message says what and why."""


# Responses request fields that map one to one onto chat-completions fields
_SAME_FIELDS = ("model", "temperature", "top_p", "parallel_tool_calls", "user", "seed", "stop")
_TEXT_PARTS = ("input_text", "output_text", "text")


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _text(content: Any, where: str) -> str | list[dict[str, Any]]:
    """A Responses message content (a string or a list of parts) as chat content."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ResponsesRequestError(
            f"{where}: content must be a string or a list of parts, got {type(content).__name__}"
        )
    parts: list[dict[str, Any]] = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS:
            parts.append({"type": "text", "text": str(part.get("text", ""))})
        elif kind == "refusal":
            parts.append({"type": "text", "text": str(part.get("refusal", ""))})
        else:
            raise ResponsesRequestError(
                f"{where}: content part {i} of type {kind!r} is not supported by agl's proxy (text parts only)"
            )
    return parts


def _tool(tool: Any, i: int) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        raise ResponsesRequestError(
            f"tools[{i}] of type {kind!r} is not supported by agl's proxy: only function tools reach the model"
        )
    function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
    if "name" not in function:
        raise ResponsesRequestError(f"tools[{i}] has no name")
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if isinstance(choice, dict):
        raise ResponsesRequestError(f"tool_choice of type {choice.get('type')!r} is not supported by agl's proxy")
    return choice


def _messages(items: Any) -> list[dict[str, Any]]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise ResponsesRequestError(f"input must be a string or a list of items, got {type(items).__name__}")
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ResponsesRequestError(f"input[{i}] is not an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role", "user")
            role = "system" if role == "developer" else role
            messages.append({"role": role, "content": _text(item.get("content", ""), f"input[{i}]")})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id") or item.get("id") or _new_id("call"),
                "type": "function",
                "function": {"name": item.get("name", ""), "arguments": item.get("arguments", "")},
            }
            last = messages[-1] if messages else None
            # one assistant turn: its text (if any) and every call it made, in order
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output", "")
            text = output if isinstance(output, str) else _text(output, f"input[{i}].output")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        elif kind == "reasoning":
            continue  # a reasoning summary is not part of the prompt a chat model sees
        else:
            raise ResponsesRequestError(f"input[{i}] of type {kind!r} is not supported by agl's proxy")
    return messages


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat-completions request a Responses request means (not streamed: see the module docstring)."""
    if body.get("previous_response_id"):
        raise ResponsesRequestError(
            "previous_response_id is not supported: agl's proxy keeps no responses; send the whole conversation in "
            "`input` (the OpenAI Agents SDK does so unless told to use server-side conversation state)"
        )
    messages = _messages(body.get("input", []))
    instructions = body.get("instructions")
    if instructions:
        messages.insert(0, {"role": "system", "content": _text(instructions, "instructions")})
    if not messages:
        raise ResponsesRequestError("input is empty: a Responses request needs at least one input item")
    chat: dict[str, Any] = {k: body[k] for k in _SAME_FIELDS if body.get(k) is not None}
    chat["messages"] = messages
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    tools = [_tool(t, i) for i, t in enumerate(body.get("tools") or [])]
    if tools:
        chat["tools"] = tools
        if body.get("tool_choice") is not None:
            chat["tool_choice"] = _tool_choice(body["tool_choice"])
    text_format = (body.get("text") or {}).get("format") or {}
    if text_format.get("type") == "json_schema":
        schema = {k: text_format[k] for k in ("name", "schema", "strict", "description") if k in text_format}
        chat["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif text_format.get("type") == "json_object":
        chat["response_format"] = {"type": "json_object"}
    return chat


def _output_items(message: dict[str, Any]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    content = message.get("content")
    if content:
        part = {"type": "output_text", "text": content, "annotations": [], "logprobs": []}
        items.append(
            {"id": _new_id("msg"), "type": "message", "status": "completed", "role": "assistant", "content": [part]}
        )
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        items.append(
            {
                "id": _new_id("fc"),
                "type": "function_call",
                "status": "completed",
                "call_id": call.get("id") or _new_id("call"),
                "name": fn.get("name", ""),
                "arguments": fn.get("arguments", ""),
            }
        )
    return items


def from_chat(answer: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """The Responses object of a chat-completions answer to the request `to_chat` made of `request`."""
    choice = (answer.get("choices") or [{}])[0]
    usage = answer.get("usage") or {}
    prompt_tokens, completion_tokens = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    cut = choice.get("finish_reason") == "length"
    return {
        "id": _new_id("resp"),
        "object": "response",
        "created_at": float(answer.get("created") or time.time()),
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "error": None,
        "model": answer.get("model") or request.get("model") or "",
        "instructions": request.get("instructions"),
        "output": _output_items(choice.get("message") or {}),
        "parallel_tool_calls": bool(request.get("parallel_tool_calls", True)),
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": request.get("tools") or [],
        "temperature": request.get("temperature"),
        "top_p": request.get("top_p"),
        "max_output_tokens": request.get("max_output_tokens"),
        "metadata": request.get("metadata") or {},
        "text": request.get("text") or {"format": {"type": "text"}},
        "usage": {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def stream_events(response: dict[str, Any]) -> Iterator[bytes]:
    """The server-sent events of a finished Responses object, in the order the OpenAI API sends them."""
    seq = iter(range(1 << 30))

    def event(kind: str, **fields: Any) -> bytes:
        data = orjson.dumps({"type": kind, "sequence_number": next(seq), **fields})
        return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"

    opening = {**response, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    yield event("response.created", response=opening)
    yield event("response.in_progress", response=opening)
    for index, item in enumerate(response["output"]):
        if item["type"] == "message":
            part = item["content"][0]
            yield event(
                "response.output_item.added", output_index=index, item={**item, "status": "in_progress", "content": []}
            )
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            yield event("response.content_part.added", **where, part={**part, "text": ""})
            yield event("response.output_text.delta", **where, delta=part["text"], logprobs=[])
            yield event("response.output_text.done", **where, text=part["text"], logprobs=[])
            yield event("response.content_part.done", **where, part=part)
        else:
            yield event(
                "response.output_item.added",
                output_index=index,
                item={**item, "status": "in_progress", "arguments": ""},
            )
            where = {"item_id": item["id"], "output_index": index}
            yield event("response.function_call_arguments.delta", **where, delta=item["arguments"])
            yield event(
                "response.function_call_arguments.done", **where, arguments=item["arguments"], name=item["name"]
            )
        yield event("response.output_item.done", output_index=index, item=item)
    final = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    yield event(final, response=response)
