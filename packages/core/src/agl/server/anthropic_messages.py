"""The Anthropic Messages API (`POST .../v1/messages`) on agl's LLM proxy, served through chat completions.

A Messages request is translated into the chat-completions request it means (`system` → a system message,
`tool_use` blocks → an assistant's tool calls, `tool_result` blocks → tool messages, `tools` with their
`input_schema` → function tools, `stop_sequences` → `stop`), sent through the proxy's chat path, and the chat answer
is translated back into a Messages object. The call is therefore recorded exactly like a chat completion — the same
exact prompt and response token ids, the same log-probs, the same agent attribution — under the route `messages`.
Why not forward to the backend's own `/v1/messages`: agl's embedded engine has none, and vLLM's (0.32, read in its
source: `vllm/entrypoints/anthropic/serving.py`) translates to its chat path itself without `return_token_ids` or
log-probs in what it returns, so a call made there could not be trained on.

Streaming: the backend is asked for a chat stream, and each chat chunk becomes the Messages events it means as it
comes (`MessagesStream`): `message_start`, each content block's start, its `text_delta`s or `input_json_delta`s and
its stop, `message_delta` with the stop reason and usage, `message_stop`; so a streaming client (the `anthropic`
SDK's `messages.stream`, Claude Code) sees the answer token by token. Images, documents and server tools are refused
with a 400 that names them; a `thinking` block of an earlier turn is left out of the prompt (a chat model is not
shown it either).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import orjson

from agl.server.call_record import too_deep
from agl.server.chat_answers import first_choice, obj, usage_tokens


class MessagesRequestError(ValueError):
    """A Messages request the proxy cannot translate; the message says what and why."""


# a tool_use input deeper than this is not given to the agent: orjson writes 255 levels, and the anthropic SDK's
# stream parser (jiter) stops near 200
MAX_INPUT_DEPTH = 128
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
    listed = body.get("tools")
    if listed is not None and not isinstance(listed, list):
        raise MessagesRequestError(f"tools must be a list of tools, got {type(listed).__name__}")
    tools = [_tool(t, i) for i, t in enumerate(listed or [])]
    if tools:
        chat["tools"] = tools
        if body.get("tool_choice") is not None:
            chat["tool_choice"] = _tool_choice(body["tool_choice"])
    return chat


def read_tool_input(arguments: Any) -> dict[str, Any] | None:
    """A chat tool call's arguments as a tool_use block's input; None where they cannot be given to the agent whole
    (not JSON, or nested deeper than MAX_INPUT_DEPTH)."""
    if not isinstance(arguments, str):
        return None
    try:
        value = json.loads(arguments or "{}")
    except (ValueError, RecursionError):  # json's parser meets Python's recursion limit near 1,000 levels
        return None
    value = value if isinstance(value, dict) else {"value": value}
    return None if too_deep(value, MAX_INPUT_DEPTH) else value


def tool_input(arguments: Any) -> dict[str, Any]:
    """`read_tool_input`, `{}` where unreadable: the agent sees an empty input, the store keeps the model's text."""
    value = read_tool_input(arguments)
    return {} if value is None else value


def _stop(finish_reason: Any, vllm_stop: Any, request: dict[str, Any]) -> tuple[str, str | None]:
    """The stop reason and stop sequence of a chat answer's finish reason (vLLM names the stop string it met)."""
    stop_reason = _STOP_REASONS.get(str(finish_reason), "end_turn")
    if stop_reason == "end_turn" and request.get("stop_sequences") and isinstance(vllm_stop, str):
        return "stop_sequence", vllm_stop
    return stop_reason, None


def _message(
    request: dict[str, Any], answer_id: str | None, model: Any, content: list[dict[str, Any]], usage: Any
) -> dict[str, Any]:
    return {
        "id": answer_id or _new_id("msg"),
        "type": "message",
        "role": "assistant",
        "model": model if isinstance(model, str) and model else str(request.get("model") or ""),
        "content": content,
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {
            "input_tokens": usage_tokens(usage, "prompt_tokens"),
            "output_tokens": usage_tokens(usage, "completion_tokens"),
        },
    }


def from_chat(answer: dict[str, Any], request: dict[str, Any], answer_id: str | None = None) -> dict[str, Any]:
    """The Messages object of a chat-completions answer to the request `to_chat` made of `request` (with the id
    `answer_id`, else a new one)."""
    choice = first_choice(answer)
    message = obj(choice.get("message"))
    content: list[dict[str, Any]] = []
    if isinstance(message.get("content"), str) and message["content"]:
        content.append({"type": "text", "text": message["content"]})
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        call = obj(call)
        fn = obj(call.get("function"))
        content.append(
            {
                "type": "tool_use",
                "id": str(call.get("id") or _new_id("toolu")),
                "name": str(fn.get("name") or ""),
                "input": tool_input(fn.get("arguments")),
            }
        )
    result = _message(request, answer_id, answer.get("model"), content, answer.get("usage"))
    result["stop_reason"], result["stop_sequence"] = _stop(
        choice.get("finish_reason"), choice.get("stop_reason"), request
    )
    return result


def _event(kind: str, **fields: Any) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **fields}) + b"\n\n"


def stream_events(message: dict[str, Any]) -> Iterator[bytes]:
    """The server-sent events of a finished Messages object, in the order Anthropic's API sends them."""
    opening = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    opening["usage"] = {"input_tokens": message["usage"]["input_tokens"], "output_tokens": 0}
    yield _event("message_start", message=opening)
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            yield _event("content_block_start", index=index, content_block={"type": "text", "text": ""})
            yield _event("content_block_delta", index=index, delta={"type": "text_delta", "text": block["text"]})
        else:
            yield _event("content_block_start", index=index, content_block={**block, "input": {}})
            partial = json.dumps(block["input"], ensure_ascii=False)
            yield _event(
                "content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": partial}
            )
        yield _event("content_block_stop", index=index)
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
    yield _event("message_delta", delta=delta, usage={"output_tokens": message["usage"]["output_tokens"]})
    yield _event("message_stop")


class MessagesStream:
    """Translates a chat stream's chunks, as they come, into the Messages events they mean (the sequence
    `stream_events` gives for the finished message, with a delta per chunk). A tool call's arguments stream as
    `input_json_delta`s once they open a JSON object; any other arguments are sent whole, as `tool_input` reads them,
    when the block ends (a client rebuilds the input from the deltas, and must be able to parse them)."""

    def __init__(self, request: dict[str, Any], answer_id: str | None = None) -> None:
        self.request = request
        self.answer_id = answer_id  # as `from_chat`'s
        self.message: dict[str, Any] | None = None  # message_start's object, then the message as it grows
        self.finished = False
        self._open: int | None = None  # the content block not yet stopped
        self._tools: dict[Any, int] = {}  # a chat tool call's index -> its content block
        self._parts: list[str] = []  # the open block's text or arguments so far (joined once, when it stops)
        self._raw: set[int] = set()  # tool_use blocks whose arguments stream as they come
        self._decided: set[int] = set()  # tool_use blocks known to stream raw or whole
        self._unreadable = False  # arguments streamed raw that no client can rebuild into the input
        # why the agent did not receive what the call answered (its SDK cannot rebuild a tool's input from the
        # deltas): the call is then not trainable
        self.unreceived: str | None = None
        self.held_bytes = 0  # the open block's text or arguments: reading them when it stops is work
        self._finish: Any = None
        self._vllm_stop: Any = None
        self._usage: Any = None

    def chunk(self, chunk: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        if self.message is None:
            ids = chunk.get("prompt_token_ids")
            self.message = _message(self.request, self.answer_id, chunk.get("model"), [], None)
            self.message["usage"]["input_tokens"] = len(ids) if isinstance(ids, list) else 0
            out.append(_event("message_start", message={**self.message, "content": []}))
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        choice = first_choice(chunk)
        if not choice:
            return out
        delta = obj(choice.get("delta"))
        text = delta.get("content")
        if isinstance(text, str) and text:
            if self._open is None or self.message["content"][self._open]["type"] != "text":
                out += self._start({"type": "text", "text": ""})
            assert self._open is not None
            self._parts.append(text)
            self.held_bytes += len(text)
            out.append(_event("content_block_delta", index=self._open, delta={"type": "text_delta", "text": text}))
        calls = delta.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            if isinstance(call, dict):
                out += self._tool_delta(call)
        if choice.get("finish_reason") is not None:
            self._finish, self._vllm_stop = choice["finish_reason"], choice.get("stop_reason")
        return out

    def _start(self, block: dict[str, Any]) -> list[bytes]:
        assert self.message is not None
        out = self._stop_open()
        self._open = len(self.message["content"])
        self.message["content"].append(block)
        out.append(_event("content_block_start", index=self._open, content_block=dict(block)))
        return out

    def _tool_delta(self, call: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        fn = obj(call.get("function"))
        key = call.get("index", 0)
        if key not in self._tools:
            block = {"type": "tool_use", "id": str(call.get("id") or _new_id("toolu")), "name": "", "input": {}}
            block["name"] = str(fn.get("name") or "")
            out += self._start(block)
            self._tools[key] = self._open  # type: ignore[assignment]
        index = self._tools[key]
        piece = fn.get("arguments")
        if not isinstance(piece, str) or not piece or index != self._open:
            return out  # a block once stopped takes no more (no backend goes back to an earlier tool call)
        self._parts.append(piece)
        self.held_bytes += len(piece)
        if index not in self._decided and (head := "".join(self._parts).lstrip()):
            self._decided.add(index)
            if head.startswith("{"):  # an object: streamed as it comes; anything else is sent whole at the end
                self._raw.add(index)
                piece = "".join(self._parts)  # what waited for its first character
        if index in self._raw:
            out.append(
                _event("content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": piece})
            )
        return out

    def _stop_open(self) -> list[bytes]:
        index = self._open
        if index is None:
            return []
        assert self.message is not None
        whole = "".join(self._parts)
        self._open, self._parts, self.held_bytes = None, [], 0
        block = self.message["content"][index]
        out: list[bytes] = []
        if block["type"] == "text":
            block["text"] = whole
        else:
            value = read_tool_input(whole)
            block["input"] = {} if value is None else value
            self._unreadable = self._unreadable or (value is None and index in self._raw)
            if index not in self._raw:
                partial = json.dumps(block["input"], ensure_ascii=False)
                out.append(
                    _event(
                        "content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": partial}
                    )
                )
        out.append(_event("content_block_stop", index=index))
        return out

    def done(self) -> list[bytes]:
        """The events that end the message, once the chat stream has ended ([DONE])."""
        out = [] if self.message is not None else self.chunk({})
        out += self._stop_open()
        assert self.message is not None
        self.finished = True
        stop_reason, stop_sequence = _stop(self._finish, self._vllm_stop, self.request)
        usage = self.message["usage"]
        if usage_tokens(self._usage, "prompt_tokens"):
            usage["input_tokens"] = usage_tokens(self._usage, "prompt_tokens")
        usage["output_tokens"] = usage_tokens(self._usage, "completion_tokens")
        self.message["stop_reason"], self.message["stop_sequence"] = stop_reason, stop_sequence
        if self._unreadable and stop_reason != "max_tokens":  # a cut answer's partial JSON is rebuilt partially
            self.unreceived = "a tool's arguments streamed as JSON no client can rebuild (not JSON, or too deep)"
        delta = {"stop_reason": stop_reason, "stop_sequence": stop_sequence}
        out.append(_event("message_delta", delta=delta, usage=dict(usage)))
        out.append(_event("message_stop"))
        return out

    def error(self, status: int, message: str) -> bytes:
        """An error event, as Anthropic's API ends a stream that failed (its SDKs raise it)."""
        self.finished = True
        return b"event: error\ndata: " + error_body(status, message) + b"\n\n"


def error_body(status: int, message: str) -> bytes:
    """An error in Anthropic's envelope, which its SDKs raise with the message."""
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})
