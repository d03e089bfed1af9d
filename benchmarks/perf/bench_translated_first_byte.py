"""First-token latency of a streamed call through agl's proxy: chat completions (passed through) against the
translated APIs (Anthropic Messages, OpenAI Responses), which translate the chat stream chunk by chunk.

A backend in this process streams TOKENS chunks GAP_S apart; an agl server in this process sits in front of it. For
each route, the time from sending the request to the first content delta (text) and to the end of the stream, the
median over ROUNDS calls. Run: `python benchmarks/perf/bench_translated_first_byte.py`. Prints numbers; asserts
nothing."""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from agl.client import API, Client
from agl.common.asgi import ThreadedServer
from agl.server.app import create_app
from agl.server.proxy import UpstreamConfig
from agl.server.settings import ServerSettings
from agl.testing.upstream import read_body, respond_json

TOKENS = 50
GAP_S = 0.01
ROUNDS = 10


async def backend(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A chat backend that streams TOKENS one-token chunks GAP_S apart, with ids and log-probs as vLLM sends."""
    if scope["type"] != "http":
        return
    request = orjson.loads(await read_body(receive) or b"{}")
    if scope["path"].endswith("/models"):
        await respond_json(send, 200, orjson.dumps({"object": "list", "data": [{"id": "m"}]}))
        return
    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}

    def chunk(i: int) -> bytes:
        choice = {"index": 0, "delta": {"content": f" w{i}"}, "finish_reason": None, "token_ids": [10 + i]}
        choice["logprobs"] = {"content": [{"token": f" w{i}", "logprob": -0.5}]}
        extra = {"prompt_token_ids": [1, 2, 3]} if i == 0 else {}
        return b"data: " + orjson.dumps({**base, "choices": [choice], **extra}) + b"\n\n"

    if not request.get("stream"):  # the whole answer, when it is done (how the translated APIs used to ask)
        await asyncio.sleep(TOKENS * GAP_S)
        text = "".join(f" w{i}" for i in range(TOKENS))
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        choice["token_ids"] = [10 + i for i in range(TOKENS)]
        choice["logprobs"] = {"content": [{"token": "w", "logprob": -0.5}] * TOKENS}
        answer = {**base, "object": "chat.completion", "choices": [choice], "prompt_token_ids": [1, 2, 3]}
        await respond_json(send, 200, orjson.dumps(answer))
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    for i in range(TOKENS):
        await send({"type": "http.response.body", "body": chunk(i), "more_body": True})
        await asyncio.sleep(GAP_S)
    end = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    usage = {**base, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": TOKENS, "total_tokens": 53}}
    tail = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in (end, usage)) + b"data: [DONE]\n\n"
    await send({"type": "http.response.body", "body": tail})


ROUTES: dict[str, tuple[str, dict[str, Any], bytes]] = {
    # route: (path, body, what marks the first content delta in its events)
    "chat": ("chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, b'"content":" w0"'),
    "messages": ("messages", {"max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}, b"text_delta"),
    "responses": ("responses", {"input": "hi"}, b"response.output_text.delta"),
}


def attempt_base(url: str) -> str:
    with Client(url) as client:
        client.enqueue("q")
    (found,) = httpx.post(f"{url}{API}/claims", json={"worker_id": "w", "lease_s": 600}).json()
    return f"{url}/rollout/{found['rollout']['id']}/attempt/{found['attempt']['id']}/v1"


def one(http: httpx.Client, base: str, route: str) -> tuple[float, float]:
    path, body, marker = ROUTES[route]
    start = time.perf_counter()
    first = None
    seen = b""
    with http.stream("POST", f"{base}/{path}", json={"model": "m", "stream": True, **body}) as resp:
        resp.raise_for_status()
        for piece in resp.iter_raw():
            if first is None:
                seen += piece
                if marker in seen:
                    first = time.perf_counter() - start
    assert first is not None, f"{route}: no content delta in the stream"
    return first, time.perf_counter() - start


def main(rounds: int = ROUNDS) -> None:
    with tempfile.TemporaryDirectory() as run, ThreadedServer(backend, lifespan="off") as up:
        settings = ServerSettings(run_dir=Path(run) / "run", upstream=UpstreamConfig(base_url=f"{up.url}/v1"))
        with ThreadedServer(create_app(settings)) as server, httpx.Client(timeout=60) as http:
            print(f"backend: {TOKENS} chunks, {GAP_S * 1000:.0f} ms apart; median of {rounds} calls per route")
            print(f"{'route':<10} {'first delta ms':>15} {'whole stream ms':>16}")
            for route in ROUTES:
                base = attempt_base(server.url)
                one(http, base, route)  # warm: connections, the model list
                times = [one(http, base, route) for _ in range(rounds)]
                first = statistics.median(t[0] for t in times) * 1000
                whole = statistics.median(t[1] for t in times) * 1000
                print(f"{route:<10} {first:>15.1f} {whole:>16.1f}")


def smoke() -> None:
    """`make bench-smoke`: that this script runs, at a small size (the numbers are not judged)."""
    main(rounds=2)


if __name__ == "__main__":
    main()
