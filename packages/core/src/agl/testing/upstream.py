"""A scripted OpenAI-compatible backend that answers like vLLM, with token ids, for tests, benchmarks and demos.

It stands in for a model where only the platform is under test: its answers are fixed by a short script, they
come back at once, and they carry what a vLLM server adds when asked (`return_token_ids`, `logprobs`), so the
proxy's token bookkeeping can be checked exactly.

Tokenizer: the text is split into words, single punctuation characters and whitespace runs
(`\\w+|[^\\w\\s]|\\s+`); a piece's id is `crc32(piece) % 50000 + 10`. `encode(render_prompt(messages, tools))`
is exactly the prompt ids a request gets back, and `encode(text)` the response ids of a text answer.

Prompt template (documented so tests can rebuild it):

    <|tools|>\\n{agl.common.hermes.tools_block(tools)}\\n      (only when tools are given)
    <|{role}|>\\n{content}{rendered tool calls}\\n        (for each message)
    <|assistant|>\\n

where message text and tool calls are rendered by `agl.common.hermes`, as the trainer's chat format renders them.

Script, first rule that matches:
1. `force_error:<status>` in the last user message → an OpenAI-style error with that HTTP status;
2. the first system or user message with `agl-step:` lines scripts the conversation, one step per assistant turn
   (the k-th line answers when the conversation holds k-1 assistant messages): `agl-step: say <JSON string>`
   answers that text, `agl-step: <tool> <JSON object>` calls that tool with those arguments (when it is offered;
   when not, as when the steps are used up, the rules below answer): a coding harness's read, edit, test, finish;
3. a system message says `agl-tools: a, b` and one of those tools is offered and not yet called in the
   conversation → a call of the first such tool (a multi-agent app gives each agent its own line);
   arguments: those an `agl-args: tool.param=value, ...` line names (a handoff's `to_agent`), then
   `expression` gets `<int><op><int>` from the last user message, other string parameters the last user
   message itself;
4. a system message says `agl-say: <text>` → that text, `{tool}` replaced by the last tool result and
   `{temperature}` and `{top_p}` by the request's (`None` when it sets none);
5. the last message is a tool result → "The answer is {tool result}";
6. tools are offered and the last user message holds `<int> <op> <int>` → a call of the first tool with
   `{"expression": "<int><op><int>"}`, finish reason `tool_calls`;
7. otherwise → "Echo: {last user message}".
Text answers are cut at `max_tokens` / `max_completion_tokens` tokens (finish reason `length`).
`POST /tokenize` (at the root, as vLLM serves it) counts a chat request's prompt ids: `{"count", "tokens"}`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import subprocess
import sys
import time
import uuid
import zlib
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

from agl.common import asgi, hermes
from agl.common.asgi import ThreadedServer
from agl.protocol import HEADER_ROLLOUT_MODE, error_bytes

VOCAB_SIZE = 50_000
READY_MARKER = "AGL_UPSTREAM_READY"
_PIECE = re.compile(r"\w+|[^\w\s]|\s+")
_ARITHMETIC = re.compile(r"(\d+)\s*([+\-*/])\s*(\d+)")
_FORCE_ERROR = re.compile(r"force_error:(\d{3})")
_TOOLS_DIRECTIVE = re.compile(r"agl-tools:[ \t]*([^\n]*)")
_ARGS_DIRECTIVE = re.compile(r"agl-args:[ \t]*([^\n]*)")
_SAY_DIRECTIVE = re.compile(r"agl-say:[ \t]*([^\n]*)")
_STEP_DIRECTIVE = re.compile(r"^agl-step:[ \t]*([^\n]*)", re.MULTILINE)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def pieces(text: str) -> list[str]:
    return _PIECE.findall(text)


def piece_id(piece: str) -> int:
    return zlib.crc32(piece.encode()) % VOCAB_SIZE + 10


def encode(text: str) -> list[int]:
    """The scripted backend's tokenizer (see the module docstring)."""
    return [piece_id(p) for p in pieces(text)]


def logprob_of(token_id: int, position: int) -> float:
    """A fixed, plausible log-probability for a generated token, so stored logprobs can be checked."""
    return -((token_id * 31 + position * 17) % 1000) / 1000.0 - 0.001


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def render_prompt(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
    """The prompt text the scripted backend builds from a chat request (template in the module docstring)."""
    parts = [f"<|tools|>\n{hermes.tools_block(tools)}\n"] if tools else []
    for message in messages:
        text = hermes.message_text(message.get("content")) + hermes.render_tool_calls(message)
        parts.append(f"<|{message.get('role', 'user')}|>\n{text}\n")
    parts.append("<|assistant|>\n")
    return "".join(parts)


class BadRequest(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.type = type_


def _error_body(status: int, message: str, type_: str) -> bytes:
    return error_bytes(message, type_, str(status))


def _tool_name(tool: dict[str, Any]) -> str:
    return str((tool.get("function") or {}).get("name", "tool"))


def _pending_directive_tool(
    system: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """The first tool an `agl-tools:` line asks for that is offered and not yet called in the conversation."""
    wanted = [n.strip() for line in _TOOLS_DIRECTIVE.findall(system) for n in line.split(",") if n.strip()]
    if not wanted:
        return None
    called = {str((c.get("function") or {}).get("name")) for m in messages for c in (m.get("tool_calls") or [])}
    offered = {_tool_name(t): t for t in tools}
    return next((offered[n] for n in wanted if n in offered and n not in called), None)


def step_line(tool: str, arguments: dict[str, Any]) -> str:
    """An `agl-step:` line (rule 2) that makes the scripted model call `tool` with `arguments` on its turn."""
    return f"agl-step: {tool} {json.dumps(arguments)}\n"


def say_line(text: str) -> str:
    """An `agl-step:` line (rule 2) that makes the scripted model answer `text` on its turn."""
    return f"agl-step: say {json.dumps(text)}\n"


def _scripted_step(messages: list[dict[str, Any]]) -> tuple[str, Any] | None:
    """The `agl-step:` line for this turn as (tool name or "say", arguments or text), or None past the script.
    A malformed line is a 400 naming it: a test's script is wrong, not the agent under test."""
    steps = next(
        (
            found
            for m in messages
            if m.get("role") in ("system", "developer", "user")
            and (found := _STEP_DIRECTIVE.findall(hermes.message_text(m.get("content"))))
        ),
        [],
    )
    turn = sum(1 for m in messages if m.get("role") == "assistant")
    if turn >= len(steps):
        return None
    head, _, rest = steps[turn].strip().partition(" ")
    try:
        value = json.loads(rest)
    except ValueError as exc:
        raise BadRequest(
            400, f"agl-step {turn + 1} is not `<tool> <JSON object>` or `say <JSON string>`: {exc}"
        ) from exc
    if (head == "say") != isinstance(value, str) or not (isinstance(value, (str, dict))):
        raise BadRequest(400, f"agl-step {turn + 1}: `say` takes a JSON string, a tool a JSON object: {steps[turn]!r}")
    return head, value


def _named_arguments(system: str, tool_name: str) -> dict[str, str]:
    """What `agl-args: tool.param=value, ...` lines set for `tool_name`."""
    named: dict[str, str] = {}
    for line in _ARGS_DIRECTIVE.findall(system):
        for item in line.split(","):
            target, _, value = item.partition("=")
            tool, _, param = target.strip().partition(".")
            if tool == tool_name and param:
                named[param] = value.strip()
    return named


def _arguments_for(
    tool: dict[str, Any], last_user: str, arithmetic: re.Match[str] | None, named: dict[str, str] | None = None
) -> dict[str, Any]:
    schema = (tool.get("function") or {}).get("parameters") or {}
    arguments: dict[str, Any] = {}
    for name, spec in (schema.get("properties") or {}).items():
        if named and name in named:
            arguments[name] = named[name]
        elif name == "expression":
            arguments[name] = "".join(arithmetic.groups()) if arithmetic else last_user
        elif isinstance(spec, dict) and spec.get("type", "string") == "string":
            arguments[name] = last_user
    return arguments


class _Reply:
    """What the script decided to answer to one request."""

    def __init__(self, request: dict[str, Any]) -> None:
        messages = request["messages"]
        tools = request.get("tools") or None
        last = messages[-1] if messages else {}
        last_user = next(
            (hermes.message_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), ""
        )
        forced = _FORCE_ERROR.search(last_user)
        if forced:
            status = int(forced.group(1))
            raise BadRequest(status, f"scripted upstream error {status} (asked for by the message)", "server_error")
        self.prompt_ids = encode(render_prompt(messages, tools))
        self.tool_call: dict[str, Any] | None = None
        self.text: str | None = None
        self.finish_reason = "stop"
        arithmetic = _ARITHMETIC.search(last_user)
        system = "\n".join(
            hermes.message_text(m.get("content")) for m in messages if m.get("role") in ("system", "developer")
        )
        last_tool = next(
            (hermes.message_text(m.get("content")) for m in reversed(messages) if m.get("role") == "tool"), ""
        )
        step = _scripted_step(messages)
        offered = {_tool_name(t): t for t in tools or []}
        if step is not None and step[0] in offered:
            self._call(offered[step[0]], step[1])
            return
        pending = _pending_directive_tool(system, messages, tools or [])
        say = _SAY_DIRECTIVE.search(system)
        if pending is not None and (step is None or step[0] != "say"):
            named = _named_arguments(system, _tool_name(pending))
            self._call(pending, _arguments_for(pending, last_user, arithmetic, named))
            return
        if step is not None and step[0] == "say":
            text = str(step[1])
        elif say:
            temperature = request.get("temperature")
            text = say.group(1).strip().replace("{tool}", last_tool).replace("{temperature}", str(temperature))
            text = text.replace("{top_p}", str(request.get("top_p")))
        elif last.get("role") == "tool":
            text = f"The answer is {hermes.message_text(last.get('content'))}"
        elif tools and arithmetic and last.get("role") == "user":
            name = str((tools[0].get("function") or {}).get("name", "tool"))
            self._call(tools[0], {"expression": "".join(arithmetic.groups())}, name=name)
            return
        else:
            text = f"Echo: {last_user}"
        limit = request.get("max_completion_tokens") or request.get("max_tokens")
        self.response_pieces = pieces(text)
        if isinstance(limit, int) and 0 < limit < len(self.response_pieces):
            self.response_pieces = self.response_pieces[:limit]
            self.finish_reason = "length"
        self.text = "".join(self.response_pieces)

    def _call(self, tool: dict[str, Any], arguments: dict[str, Any], name: str | None = None) -> None:
        name = name or _tool_name(tool)
        encoded = _dumps(arguments)
        self.tool_call = {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": name, "arguments": encoded},
        }
        self.response_pieces = pieces(hermes.render_tool_call(name, encoded))
        self.finish_reason = "tool_calls"

    @property
    def response_ids(self) -> list[int]:
        return [piece_id(p) for p in self.response_pieces]

    def message(self) -> dict[str, Any]:
        if self.tool_call is not None:
            return {"role": "assistant", "content": None, "tool_calls": [self.tool_call]}
        return {"role": "assistant", "content": self.text}

    def usage(self) -> dict[str, int]:
        n_prompt, n_response = len(self.prompt_ids), len(self.response_pieces)
        return {"prompt_tokens": n_prompt, "completion_tokens": n_response, "total_tokens": n_prompt + n_response}


def _logprob_entries(pieces_: list[str], start: int) -> list[dict[str, Any]]:
    out = []
    for i, piece in enumerate(pieces_, start):
        out.append(
            {
                "token": piece,
                "logprob": logprob_of(piece_id(piece), i),
                "bytes": list(piece.encode()),
                "top_logprobs": [],
            }
        )
    return out


class ScriptedUpstream:
    """The ASGI app. `reject_unknown_params` answers 400 to `return_token_ids`, as a hosted API does."""

    def __init__(
        self,
        *,
        model: str = "scripted",
        reject_unknown_params: bool = False,
        delay_s: float = 0.0,
        delay_jitter: float = 0.0,
    ) -> None:
        self.model = model
        self.reject_unknown_params = reject_unknown_params
        self.delay_s = delay_s
        # Real model calls do not all take the same time; a fixed delay keeps concurrent clients in lock-step.
        # Each answer waits delay_s * uniform(1 - jitter, 1 + jitter), from a seeded generator.
        self.delay_jitter = min(max(delay_jitter, 0.0), 1.0)
        self._rng = random.Random(0)
        self.requests = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                event = await receive()
                if event["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif event["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        path, method = scope["path"].rstrip("/"), scope["method"]
        if path.endswith("/v1/models") and method == "GET":
            body = {"object": "list", "data": [{"id": self.model, "object": "model", "created": 0, "owned_by": "agl"}]}
            await respond_json(send, 200, orjson.dumps(body))
        elif path == "/tokenize" and method == "POST":  # vLLM's, at the server's root: a chat request's prompt
            request = orjson.loads(await read_body(receive))
            ids = encode(render_prompt(request["messages"], request.get("tools")))
            await respond_json(send, 200, orjson.dumps({"count": len(ids), "max_model_len": 32768, "tokens": ids}))
        elif path.endswith("/v1/chat/completions") and method == "POST":
            mode = next((v.decode() for k, v in scope["headers"] if k == HEADER_ROLLOUT_MODE.encode()), None)
            await self._chat(receive, send, mode)
        else:
            await respond_json(
                send, 404, _error_body(404, f"no route {method} {scope['path']}", "invalid_request_error")
            )

    async def _chat(self, receive: Receive, send: Send, mode: str | None = None) -> None:
        self.requests += 1
        raw = await read_body(receive)
        try:
            request = _parse(raw, self.reject_unknown_params)
            reply = _Reply(request)
        except BadRequest as exc:
            await respond_json(send, exc.status, _error_body(exc.status, str(exc), exc.type))
            return
        if self.delay_s:
            spread = self.delay_jitter
            await asyncio.sleep(self.delay_s * (self._rng.uniform(1 - spread, 1 + spread) if spread else 1.0))
        model = request.get("model") or self.model
        want_ids = bool(request.get("return_token_ids"))
        want_logprobs = bool(request.get("logprobs"))
        if request.get("stream"):
            await self._stream(send, request, reply, model, want_ids, want_logprobs)
            return
        choice: dict[str, Any] = {
            "index": 0,
            "message": reply.message(),
            "finish_reason": reply.finish_reason,
            "logprobs": {"content": _logprob_entries(reply.response_pieces, 0)} if want_logprobs else None,
        }
        body: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [choice],
            "usage": reply.usage(),
            # which rollout mode agl's proxy said this call belongs to, so tests can see it arrive
            "system_fingerprint": f"scripted;mode={mode or 'none'}",
        }
        if want_ids:
            choice["token_ids"] = reply.response_ids
            body["prompt_token_ids"] = reply.prompt_ids
        await respond_json(send, 200, orjson.dumps(body))

    async def _stream(
        self, send: Send, request: dict[str, Any], reply: _Reply, model: str, want_ids: bool, want_logprobs: bool
    ) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")],
            }
        )
        base = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
        }

        def chunk(
            delta: dict[str, Any],
            piece_list: list[str],
            start: int,
            finish: str | None = None,
            extra: dict[str, Any] | None = None,
        ) -> bytes:
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
            if want_logprobs and piece_list:
                choice["logprobs"] = {"content": _logprob_entries(piece_list, start)}
            if want_ids:
                choice["token_ids"] = [piece_id(p) for p in piece_list]
            return b"data: " + orjson.dumps({**base, "choices": [choice], **(extra or {})}) + b"\n\n"

        first_extra = {"prompt_token_ids": reply.prompt_ids} if want_ids else {}
        events = [chunk({"role": "assistant", "content": ""}, [], 0, extra=first_extra)]
        if reply.tool_call is not None:
            fn = reply.tool_call["function"]
            events.append(
                chunk(
                    {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": reply.tool_call["id"],
                                "type": "function",
                                "function": {"name": fn["name"], "arguments": ""},
                            }
                        ]
                    },
                    [],
                    0,
                )
            )
            events.append(
                chunk(
                    {"tool_calls": [{"index": 0, "function": {"arguments": fn["arguments"]}}]}, reply.response_pieces, 0
                )
            )
        else:
            events += [chunk({"content": p}, [p], i) for i, p in enumerate(reply.response_pieces)]
        events.append(chunk({}, [], 0, reply.finish_reason))
        if (request.get("stream_options") or {}).get("include_usage"):
            events.append(b"data: " + orjson.dumps({**base, "choices": [], "usage": reply.usage()}) + b"\n\n")
        events.append(b"data: [DONE]\n\n")
        for event in events:
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _parse(raw: bytes, reject_unknown_params: bool) -> dict[str, Any]:
    try:
        request = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(400, f"request body is not valid JSON: {exc}") from exc
    if not isinstance(request, dict) or not isinstance(request.get("messages"), list) or not request["messages"]:
        raise BadRequest(400, "request body must be a JSON object with a non-empty 'messages' list")
    if not all(isinstance(m, dict) for m in request["messages"]):
        raise BadRequest(400, "every entry of 'messages' must be an object")
    if reject_unknown_params and "return_token_ids" in request:
        raise BadRequest(400, "Unrecognized request argument supplied: return_token_ids")
    return request


async def read_body(receive: Receive) -> bytes:
    """The whole body of an ASGI request, however many messages it came in (for stand-in servers in tests)."""
    raw = bytearray()
    while True:
        event = await receive()
        raw += event.get("body", b"")
        if not event.get("more_body"):
            return bytes(raw)


async def respond_json(send: Send, status: int, body: bytes) -> None:
    """Send `body` (JSON text) as a whole ASGI response with `status`."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


class ThreadedUpstream(ThreadedServer):
    """A scripted upstream served from a background thread of this process; `url` ends in `/v1`."""

    def __init__(self, app: ScriptedUpstream, host: str = "127.0.0.1") -> None:
        super().__init__(app, host=host, lifespan="on", name="agl-scripted-upstream")
        self.app = app
        self.url += "/v1"


def run_in_thread(**options: Any) -> ThreadedUpstream:
    """Start a scripted upstream in this process (options as for `ScriptedUpstream`)."""
    return ThreadedUpstream(ScriptedUpstream(**options)).start()


def start_upstream_process(
    *,
    reject_unknown_params: bool = False,
    delay_s: float = 0.0,
    delay_jitter: float = 0.0,
    model: str = "scripted",
    timeout: float = 60.0,
) -> tuple[subprocess.Popen[str], str]:
    """Start `python -m agl.testing.upstream` on a free port; returns the process and its `/v1` base URL."""
    from agl.common.processes import read_ready_line

    args = [sys.executable, "-m", "agl.testing.upstream", "--port=0", f"--model={model}", f"--delay-s={delay_s}"]
    args.append(f"--delay-jitter={delay_jitter}")
    if reject_unknown_params:
        args.append("--reject-unknown-params")
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return proc, read_ready_line(proc, READY_MARKER, timeout)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agl.testing.upstream", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--model", default="scripted", help="model name reported when a request names none")
    parser.add_argument(
        "--reject-unknown-params", action="store_true", help="answer 400 to return_token_ids, as a hosted API does"
    )
    parser.add_argument("--delay-s", type=float, default=0.0, help="wait this long before every answer")
    parser.add_argument(
        "--delay-jitter", type=float, default=0.0, help="spread of the wait: delay-s × uniform(1 - jitter, 1 + jitter)"
    )
    args = parser.parse_args(argv)
    app = ScriptedUpstream(
        model=args.model,
        reject_unknown_params=args.reject_unknown_params,
        delay_s=args.delay_s,
        delay_jitter=args.delay_jitter,
    )
    sock = asgi.bind(args.host, args.port)  # connections wait in the backlog from here on: announcing now is safe
    print(f"{READY_MARKER} {asgi.url_of(sock)}/v1", flush=True)
    asgi.serve(app, sock, lifespan="on")


if __name__ == "__main__":
    main()
