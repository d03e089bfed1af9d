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

Streaming: the backend is asked for a chat stream, and each chat chunk becomes the Responses events it means as it
comes (`ResponsesStream`: a text delta per chunk, an arguments delta per tool call's chunk), so a streaming client
(the OpenAI Agents SDK's `Runner.run_streamed`) sees the answer token by token.
`previous_response_id` (server-side conversation state, which Agno's and the Agents SDK's stateful modes send): each
answer's id names its attempt and its call (`response_id`), so a later turn of the same attempt is served from the
store: the earlier call's messages and its answer, then the new input (`continued`). Its instructions are not carried
over, as OpenAI does not carry them. An id of another attempt, or one agl never gave, is answered as OpenAI answers
one it does not hold (400, `previous_response_not_found`, "Previous response with id '...' not found."), the answer
on which clients that keep their own history (Agno's `OpenAIResponses`) send the whole conversation instead.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterator
from typing import Any

import orjson

from agl.server.chat_answers import first_choice, obj, usage_tokens


class ResponsesRequestError(ValueError):
    """A Responses request the proxy cannot translate; the message says what and why."""


# Responses request fields that map one to one onto chat-completions fields
_SAME_FIELDS = ("model", "temperature", "top_p", "parallel_tool_calls", "user", "seed", "stop")
_TEXT_PARTS = ("input_text", "output_text", "text")


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def response_id(attempt_id: str, seq: int) -> str:
    """The id of the answer to an attempt's call `seq`: what a later `previous_response_id` names."""
    return f"resp_{seq}_{attempt_id}"


def named_call(previous: Any, attempt_id: str) -> int | None:
    """The seq of this attempt's call that `previous` (a `previous_response_id`) names, or None: not one of its
    answers."""
    if not isinstance(previous, str):
        return None
    prefix, _, rest = previous.partition("_")
    seq, _, attempt = rest.partition("_")
    return int(seq) if prefix == "resp" and seq.isdigit() and attempt == attempt_id else None


def continued(earlier: list[Any], answer: Any, new: list[dict[str, Any]], instructions: bool) -> list[dict[str, Any]]:
    """The chat messages of a turn that continues an earlier call: its messages (less the system message its own
    instructions made, which OpenAI does not carry over) and its answer, then this turn's (`new`, with this turn's
    instructions first when `instructions`)."""
    kept = [m for m in earlier if isinstance(m, dict)]
    if kept and kept[0].get("role") == "system":
        kept = kept[1:]
    answered = [{k: v for k, v in answer.items() if k in ("role", "content", "tool_calls")}] if answer else []
    head, tail = (new[:1], new[1:]) if instructions else ([], new)
    return [*head, *kept, *answered, *tail]


def not_found(previous: str) -> dict[str, Any]:
    """OpenAI's answer (with a 400) to a `previous_response_id` it does not hold."""
    return {
        "error": {
            "message": f"Previous response with id '{previous}' not found.",
            "type": "invalid_request_error",
            "param": "previous_response_id",
            "code": "previous_response_not_found",
        }
    }


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
    listed = body.get("tools")
    if listed is not None and not isinstance(listed, list):
        raise ResponsesRequestError(f"tools must be a list of tools, got {type(listed).__name__}")
    tools = [_tool(t, i) for i, t in enumerate(listed or [])]
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


def _created(value: Any) -> float:
    """The answer's creation time; now, where the backend gave none or no number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return time.time()
    return float(value)


def _message_item(text: str, status: str = "completed") -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"id": _new_id("msg"), "type": "message", "status": status, "role": "assistant", "content": [part]}


def _call_item(call_id: Any, name: Any, arguments: Any, status: str = "completed") -> dict[str, Any]:
    return {
        "id": _new_id("fc"),
        "type": "function_call",
        "status": status,
        "call_id": str(call_id or _new_id("call")),
        "name": str(name or ""),
        "arguments": arguments if isinstance(arguments, str) else "",
    }


def _output_items(message: dict[str, Any]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    content = message.get("content")
    if isinstance(content, str) and content:
        items.append(_message_item(content))
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        call = obj(call)
        fn = obj(call.get("function"))
        items.append(_call_item(call.get("id"), fn.get("name"), fn.get("arguments")))
    return items


def _response(
    request: dict[str, Any],
    answer_id: str | None,
    model: Any,
    created: Any,
    output: list[dict[str, Any]],
    usage: Any,
    cut: bool,
) -> dict[str, Any]:
    prompt_tokens, completion_tokens = usage_tokens(usage, "prompt_tokens"), usage_tokens(usage, "completion_tokens")
    return {
        "id": answer_id or _new_id("resp"),
        "object": "response",
        "created_at": _created(created),
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "error": None,
        "model": model if isinstance(model, str) and model else str(request.get("model") or ""),
        "instructions": request.get("instructions"),
        "previous_response_id": request.get("previous_response_id"),
        "output": output,
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


def from_chat(answer: dict[str, Any], request: dict[str, Any], answer_id: str | None = None) -> dict[str, Any]:
    """The Responses object of a chat-completions answer to the request `to_chat` made of `request`, with the id
    `answer_id` (`response_id`: a later turn may continue from it), else a new one."""
    choice = first_choice(answer)
    message = obj(choice.get("message"))
    cut = choice.get("finish_reason") == "length"
    return _response(
        request,
        answer_id,
        answer.get("model"),
        answer.get("created"),
        _output_items(message),
        answer.get("usage"),
        cut,
    )


class _Events:
    """Responses events, numbered in the order they are sent."""

    def __init__(self) -> None:
        self.sent = 0

    def __call__(self, kind: str, **fields: Any) -> bytes:
        data = orjson.dumps({"type": kind, "sequence_number": self.sent, **fields})
        self.sent += 1
        return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"


def stream_events(response: dict[str, Any]) -> Iterator[bytes]:
    """The server-sent events of a finished Responses object, in the order the OpenAI API sends them."""
    event = _Events()
    opening = {**response, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    yield event("response.created", response=opening)
    yield event("response.in_progress", response=opening)
    for index, item in enumerate(response["output"]):
        yield from _item_opened(event, index, item)
        if item["type"] == "message":
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            yield event("response.output_text.delta", **where, delta=item["content"][0]["text"], logprobs=[])
        else:
            where = {"item_id": item["id"], "output_index": index}
            yield event("response.function_call_arguments.delta", **where, delta=item["arguments"])
        yield from _item_done(event, index, item)
    final = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    yield event(final, response=response)


def _item_opened(event: _Events, index: int, item: dict[str, Any]) -> Iterator[bytes]:
    if item["type"] == "message":
        part = item["content"][0]
        opened = {**item, "status": "in_progress", "content": []}
        yield event("response.output_item.added", output_index=index, item=opened)
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        yield event("response.content_part.added", **where, part={**part, "text": ""})
    else:
        yield event(
            "response.output_item.added", output_index=index, item={**item, "status": "in_progress", "arguments": ""}
        )


def _item_done(event: _Events, index: int, item: dict[str, Any]) -> Iterator[bytes]:
    if item["type"] == "message":
        part = item["content"][0]
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        yield event("response.output_text.done", **where, text=part["text"], logprobs=[])
        yield event("response.content_part.done", **where, part=part)
    else:
        where = {"item_id": item["id"], "output_index": index}
        yield event("response.function_call_arguments.done", **where, arguments=item["arguments"], name=item["name"])
    yield event("response.output_item.done", output_index=index, item=item)


class ResponsesStream:
    """Translates a chat stream's chunks, as they come, into the Responses events they mean (the sequence
    `stream_events` gives for the finished response, with a delta per chunk)."""

    def __init__(self, request: dict[str, Any], answer_id: str | None = None) -> None:
        self.request = request
        self.answer_id = answer_id  # as `from_chat`'s
        self.response: dict[str, Any] | None = None  # response.created's object; the finished one at the end
        self.finished = False
        self.unreceived: str | None = None  # the arguments pass on as text: an agent receives what the model wrote
        self.held_bytes = 0  # the open item's text or arguments: joined when it is done
        self._event = _Events()
        self._output: list[dict[str, Any]] = []
        self._open: int | None = None  # the output item not yet done
        self._pieces: list[str] = []  # the open item's text or arguments so far
        self._tools: dict[Any, int] = {}  # a chat tool call's index -> its output item
        self._finish: Any = None
        self._usage: Any = None

    def chunk(self, chunk: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        if self.response is None:
            self.response = _response(
                self.request, self.answer_id, chunk.get("model"), chunk.get("created"), [], None, False
            )
            opening = {**self.response, "status": "in_progress", "usage": None}
            out += [
                self._event("response.created", response=opening),
                self._event("response.in_progress", response=opening),
            ]
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        choice = first_choice(chunk)
        if not choice:
            return out
        delta = obj(choice.get("delta"))
        text = delta.get("content")
        if isinstance(text, str) and text:
            if self._open is None or self._output[self._open]["type"] != "message":
                out += self._start(_message_item("", "in_progress"))
            assert self._open is not None
            self._pieces.append(text)
            self.held_bytes += len(text)
            where = {"item_id": self._output[self._open]["id"], "output_index": self._open, "content_index": 0}
            out.append(self._event("response.output_text.delta", **where, delta=text, logprobs=[]))
        calls = delta.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            if not isinstance(call, dict):
                continue
            fn = obj(call.get("function"))
            key = call.get("index", 0)
            if key not in self._tools:
                out += self._start(_call_item(call.get("id"), fn.get("name"), "", "in_progress"))
                self._tools[key] = self._open  # type: ignore[assignment]
            piece = fn.get("arguments")
            if isinstance(piece, str) and piece and self._tools[key] == self._open:
                self._pieces.append(piece)
                self.held_bytes += len(piece)
                where = {"item_id": self._output[self._open]["id"], "output_index": self._open}
                out.append(self._event("response.function_call_arguments.delta", **where, delta=piece))
        if choice.get("finish_reason") is not None:
            self._finish = choice["finish_reason"]
        return out

    def _start(self, item: dict[str, Any]) -> list[bytes]:
        out = self._close_open()
        self._open = len(self._output)
        self._output.append(item)
        out += list(_item_opened(self._event, self._open, item))
        return out

    def _close_open(self) -> list[bytes]:
        index = self._open
        if index is None:
            return []
        self._open = None
        item, whole = self._output[index], "".join(self._pieces)
        self._pieces, self.held_bytes = [], 0
        item["status"] = "completed"
        if item["type"] == "message":
            item["content"][0]["text"] = whole
        else:
            item["arguments"] = whole
        return list(_item_done(self._event, index, item))

    def done(self) -> list[bytes]:
        """The events that end the response, once the chat stream has ended ([DONE])."""
        out = [] if self.response is not None else self.chunk({})
        out += self._close_open()
        assert self.response is not None
        self.finished = True
        final = _response(
            self.request,
            self.answer_id,
            self.response["model"],
            self.response["created_at"],
            self._output,
            self._usage,
            self._finish == "length",
        )
        final["id"] = self.response["id"]
        self.response = final
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        return [*out, self._event(kind, response=final)]

    def error(self, status: int, message: str) -> bytes:
        """An error event, as the Responses API ends a stream that failed; its `error` object makes the OpenAI SDK
        raise it, as it does a chat stream's."""
        self.finished = True
        code = "upstream_error" if status >= 500 else "invalid_request_error"
        error = {"type": code, "code": code, "message": message}
        return self._event("error", code=code, message=message, param=None, error=error)
