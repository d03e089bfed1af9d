"""A chat backend for the translated APIs' tests (Messages, Responses): the last user message names a `Script`,
answered as vLLM answers (token ids, log-probs), as one JSON body or as a stream of one chunk per piece; and a real
agl server in this process in front of it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from agl.client import API, Client
from agl.common.asgi import ThreadedServer
from agl.schema import LLMCall
from agl.server.app import create_app
from agl.server.proxy import UpstreamConfig
from agl.server.settings import ServerSettings
from agl.testing.upstream import read_body, respond_json

PROMPT_IDS = [1, 2, 3]


@dataclass
class Script:
    text: list[str] = field(default_factory=list)  # the answer's text, a chunk per piece
    calls: list[tuple[str, list[str]]] = field(default_factory=list)  # tool calls: name, arguments a chunk per piece
    usage: Any = "counted"  # "counted": the real counts; anything else is sent as the usage
    created: Any = 1_700_000_000
    finish: str = "stop"
    gap_s: float = 0.0  # a stream's pause before each chunk
    error_after: int | None = None  # a stream's error event after this many pieces

    def pieces(self) -> int:
        return len(self.text) + sum(len(args) for _, args in self.calls)

    def usage_of(self) -> Any:
        n = self.pieces()
        counted = {"prompt_tokens": len(PROMPT_IDS), "completion_tokens": n, "total_tokens": len(PROMPT_IDS) + n}
        return counted if self.usage == "counted" else self.usage


def nested(depth: int) -> str:
    """Tool arguments: an object whose value nests lists `depth` levels deep."""
    return '{"a": ' + "[" * depth + "]" * depth + "}"


def _logprobs(n: int, start: int) -> dict[str, Any]:
    return {"content": [{"token": "t", "logprob": -0.1 * (start + i + 1)} for i in range(n)]}


class ScriptedChat:
    """The ASGI app; `scripts` maps a user message to its Script; `last_sent` is when the last stream's final chunk
    went out (time.monotonic)."""

    def __init__(self, scripts: dict[str, Script]) -> None:
        self.scripts = scripts
        self.last_sent = 0.0
        self.requests: list[dict[str, Any]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        raw = await read_body(receive)
        if scope["path"].endswith("/models"):
            await respond_json(send, 200, orjson.dumps({"object": "list", "data": [{"id": "m"}]}))
            return
        request = orjson.loads(raw)
        self.requests.append(request)
        script = self.scripts[request["messages"][-1]["content"]]
        if request.get("stream"):
            await self._stream(send, script, bool((request.get("stream_options") or {}).get("include_usage")))
        else:
            await respond_json(send, 200, orjson.dumps(self._answer(script)))

    def _answer(self, script: Script) -> dict[str, Any]:
        n = script.pieces()
        calls = [
            {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": "".join(args)}}
            for i, (name, args) in enumerate(script.calls)
        ]
        message: dict[str, Any] = {"role": "assistant", "content": "".join(script.text) or None}
        if calls:
            message["tool_calls"] = calls
        choice = {
            "index": 0,
            "message": message,
            "finish_reason": script.finish,
            "token_ids": list(range(10, 10 + n)),
            "logprobs": _logprobs(n, 0),
        }
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": script.created,
            "model": "m",
            "prompt_token_ids": PROMPT_IDS,
            "choices": [choice],
            "usage": script.usage_of(),
        }

    async def _stream(self, send: Any, script: Script, include_usage: bool) -> None:
        base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": script.created, "model": "m"}
        given = 0

        def chunk(delta: dict[str, Any], ids: int = 0, finish: str | None = None, **extra: Any) -> bytes:
            nonlocal given
            choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
            if ids:
                choice["token_ids"] = list(range(10 + given, 10 + given + ids))
                choice["logprobs"] = _logprobs(ids, given)
                given += ids
            return b"data: " + orjson.dumps({**base, "choices": [choice], **extra}) + b"\n\n"

        pieces = [chunk({"role": "assistant", "content": ""}, prompt_token_ids=PROMPT_IDS)]
        pieces += [chunk({"content": text}, 1) for text in script.text]
        for i, (name, args) in enumerate(script.calls):
            opened = {"index": i, "id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": ""}}
            pieces.append(chunk({"tool_calls": [opened]}))
            pieces += [chunk({"tool_calls": [{"index": i, "function": {"arguments": a}}]}, 1) for a in args]
        if script.error_after is not None:
            error = {"error": {"message": "the engine failed mid-answer", "type": "server_error", "code": 500}}
            pieces[script.error_after + 1 :] = [b"data: " + orjson.dumps(error) + b"\n\n"]
        else:
            pieces.append(chunk({}, finish=script.finish))
            if include_usage:
                usage = {**base, "choices": [], "usage": script.usage_of()}
                pieces.append(b"data: " + orjson.dumps(usage) + b"\n\n")
        pieces.append(b"data: [DONE]\n\n")
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for piece in pieces:
            if script.gap_s:
                await asyncio.sleep(script.gap_s)
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        self.last_sent = time.monotonic()
        await send({"type": "http.response.body", "body": b""})


@dataclass
class Served:
    url: str
    upstream: ScriptedChat


def serve(tmp_path: Path, scripts: dict[str, Script]) -> Iterator[Served]:
    """A real agl server (in this process, on its own thread) in front of a ScriptedChat."""
    chat = ScriptedChat(scripts)
    with ThreadedServer(chat, lifespan="off") as upstream:
        app = create_app(
            ServerSettings(run_dir=tmp_path / "run", upstream=UpstreamConfig(base_url=f"{upstream.url}/v1"))
        )
        with ThreadedServer(app) as server:
            yield Served(server.url, chat)


def attempt(url: str) -> tuple[str, str]:
    """A fresh attempt: its rollout id and the base URL its SDK clients are given (without /v1)."""
    with Client(url) as client:
        client.enqueue("q")
    (found,) = httpx.post(f"{url}{API}/claims", json={"worker_id": "w", "lease_s": 600}).json()
    rid = found["rollout"]["id"]
    return rid, f"{url}/rollout/{rid}/attempt/{found['attempt']['id']}"


def stored(url: str, rid: str, n: int = 1) -> list[LLMCall]:
    """The rollout's calls once `n` are stored, by seq."""
    with Client(url) as client:
        deadline = time.monotonic() + 30
        while len(calls := client.rollout_detail(rid).llm_calls) < n and time.monotonic() < deadline:
            time.sleep(0.05)
    return sorted(calls, key=lambda c: c.seq)
