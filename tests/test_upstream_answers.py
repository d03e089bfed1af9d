"""The proxy distrusts its upstream (issue 41's N16) and parses large request bodies off the event loop (N14).

An upstream's answer with malformed choices, ids or log-probs, ids and log-probs that do not pair, a body past
the size cap, a redirect, or a stream without event separators is answered 502 to the agent (a stream already
answered 200 is ended) and stored with its error, never trainable; before, these were 500s with nothing stored,
misaligned training data, answers of any size read whole, and redirects followed. A hostile upstream in this
process serves them to a real agl server over HTTP.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from agl.client import API, Client
from agl.common.asgi import ThreadedServer
from agl.common.processes import start_server
from agl.schema import LLMCall
from agl.server.app import create_app
from agl.server.call_record import parse_chat
from agl.server.proxy import UpstreamConfig
from agl.server.settings import ServerSettings
from agl.testing.upstream import read_body, respond_json

CAP = 1024 * 1024  # the server under test reads answers and SSE events up to this many bytes


def answer(ids: Any = (7, 8, 9), logprobs: Any = (-0.5, -0.25, -1.0), **choice: Any) -> dict[str, Any]:
    """A vLLM-style answer with token ids and log-probs; `choice` overrides fields of its one choice."""
    return {
        "id": "x",
        "object": "chat.completion",
        "model": "m",
        "prompt_token_ids": [1, 2, 3],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok"},
                "finish_reason": "stop",
                "token_ids": list(ids),
                "logprobs": {"content": [{"token": "t", "logprob": lp} for lp in logprobs]},
                **choice,
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6},
    }


def sse(first: dict[str, Any], *rest: dict[str, Any]) -> bytes:
    """A stream of chunks, the first with the prompt's ids (as vLLM sends them), ended by [DONE]."""
    chunks = [{**first, "prompt_token_ids": [1, 2, 3]}, *rest]
    return b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def chunk(ids: list[int], logprobs: list[Any], text: str = "a") -> dict[str, Any]:
    return {
        "id": "x",
        "object": "chat.completion.chunk",
        "choices": [
            {
                "index": 0,
                "delta": {"content": text},
                "token_ids": ids,
                "logprobs": {"content": [{"token": "t", "logprob": lp} for lp in logprobs]},
                "finish_reason": None,
            }
        ],
    }


Send = Callable[[dict[str, Any]], Any]


async def send_body(send: Send, status: int, parts: Iterator[bytes], headers: list[tuple[bytes, bytes]]) -> None:
    """A response sent in pieces, without a content length (the proxy cannot know its size in advance)."""
    await send({"type": "http.response.start", "status": status, "headers": headers})
    for part in parts:
        await send({"type": "http.response.body", "body": part, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


SSE_HEADERS = [(b"content-type", b"text/event-stream")]
JSON_HEADERS = [(b"content-type", b"application/json")]


class Hostile:
    """An upstream whose answer is picked by the last user message: the name of a scenario below."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        raw = await read_body(receive)
        if scope["path"].endswith("/models"):
            await respond_json(send, 200, orjson.dumps({"object": "list", "data": [{"id": "m"}]}))
            return
        if "/elsewhere/" in scope["path"]:  # where the redirect points: a fine answer, which agl must not take
            await respond_json(send, 200, orjson.dumps(answer()))
            return
        scenario = orjson.loads(raw)["messages"][-1]["content"]
        if scenario == "redirect":
            headers = [(b"location", b"/v1/elsewhere/chat/completions"), (b"content-length", b"0")]
            await send({"type": "http.response.start", "status": 307, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
        elif scenario == "huge":  # valid JSON, four times the cap, its length not announced
            pad = b" " * (64 * 1024)
            parts = iter([orjson.dumps(answer())[:-1] + b', "pad": "', *[pad] * 64, b'"}'])
            await send_body(send, 200, parts, JSON_HEADERS)
        elif scenario == "stream-good":
            await send_body(send, 200, iter([sse(chunk([7], [-0.5]), chunk([8], [-0.25]))]), SSE_HEADERS)
        elif scenario == "stream-bad-logprob":  # a malformed chunk, then the rest of a stream and [DONE]
            await send_body(send, 200, iter([sse(chunk([7], ["x"]), chunk([8], [-0.25]))]), SSE_HEADERS)
        elif scenario == "stream-misaligned":
            await send_body(send, 200, iter([sse(chunk([7, 8], [-0.5]), chunk([9, 10], [-0.25]))]), SSE_HEADERS)
        elif scenario == "stream-endless":  # valid events, one token each, that never end (until agl hangs up)
            event = b"data: " + orjson.dumps(chunk([7], [-0.5], "x" * 1000)) + b"\n\n"
            parts = itertools.chain(
                [sse(chunk([7], [-0.5]))[: -len(b"data: [DONE]\n\n")]], itertools.repeat(event * 16)
            )
            await send_body(send, 200, parts, SSE_HEADERS)
        elif scenario == "stream-no-separator":  # 8 MB of one event that never ends
            parts = iter([b"data: {" + b"x" * (64 * 1024)] + [b"x" * (64 * 1024)] * 127)
            await send_body(send, 200, parts, SSE_HEADERS)
        else:
            await respond_json(send, 200, orjson.dumps(MALFORMED[scenario]))


# answer bodies (JSON, 200) that must not be trusted: name -> body
MALFORMED: dict[str, Any] = {
    "good": answer(),
    "misaligned": answer(ids=[7, 8, 9, 10, 11], logprobs=[-0.5, -0.25, -1.0]),
    "choices-not-list": {**answer(), "choices": {"0": answer()["choices"][0]}},
    "choice-not-object": {**answer(), "choices": ["ok"]},
    "ids-not-ints": answer(ids=["7", "8", "9"]),
    "logprob-not-number": answer(logprobs=[-0.5, "high", -1.0]),
}


@pytest.fixture
def hostile_server(tmp_path: Path) -> Iterator[str]:
    """A real agl server (in this process, on its own thread) whose upstream is `Hostile`, with a small cap."""
    with ThreadedServer(Hostile(), lifespan="off") as upstream:
        config = UpstreamConfig(base_url=f"{upstream.url}/v1")
        # set after construction, so this module also runs (and fails) against a proxy without the caps
        config.max_answer_bytes = CAP
        config.max_event_bytes = CAP
        config.max_stream_bytes = 4 * CAP
        app = create_app(ServerSettings(run_dir=tmp_path / "run", upstream=config))
        with ThreadedServer(app) as server:
            yield server.url


def attempt(url: str) -> tuple[str, str]:
    """A fresh attempt: its rollout id and its proxy base URL."""
    with Client(url) as client:
        client.enqueue("q")
    (found,) = httpx.post(f"{url}{API}/claims", json={"worker_id": "w", "lease_s": 600}).json()
    rid = found["rollout"]["id"]
    return rid, f"{url}/rollout/{rid}/attempt/{found['attempt']['id']}/v1"


def ask(base: str, scenario: str, *, stream: bool = False) -> httpx.Response:
    body = {"model": "m", "stream": stream, "messages": [{"role": "user", "content": scenario}]}
    return httpx.post(f"{base}/chat/completions", json=body, timeout=60)


def stored(url: str, rid: str) -> LLMCall:
    with Client(url) as client:
        deadline = time.monotonic() + 30
        while not (calls := client.rollout_detail(rid).llm_calls) and time.monotonic() < deadline:
            time.sleep(0.05)
    (call,) = calls
    return call


@pytest.mark.parametrize(
    ("scenario", "named"),
    [
        ("misaligned", "5 token ids but 3 log-probs"),
        ("choices-not-list", "choices must be a list"),
        ("choice-not-object", "choices[0] must be an object"),
        ("ids-not-ints", "token_ids must be a list of integers"),
        ("logprob-not-number", "logprob must be a number"),
        ("huge", f"{CAP} bytes"),
        ("redirect", "redirect"),
    ],
)
def test_an_unusable_upstream_answer_is_a_502_stored_not_trainable(
    hostile_server: str, scenario: str, named: str
) -> None:
    rid, base = attempt(hostile_server)
    resp = ask(base, scenario)
    assert resp.status_code == 502, resp.text[:300]
    error = resp.json()["error"]
    assert (error["type"], error["code"]) == ("upstream_error", "upstream_bad_answer")
    assert named in error["message"]
    call = stored(hostile_server, rid)
    assert (call.trainable, call.status, call.http_status) == (False, "error", 502)
    assert str(call.seq) == resp.headers["x-agl-llm-seq"]
    assert named in (call.error or "")


def test_a_good_answer_still_passes_and_trains(hostile_server: str) -> None:
    rid, base = attempt(hostile_server)
    resp = ask(base, "good")
    assert resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"] == "ok"
    call = stored(hostile_server, rid)
    assert call.trainable and call.response_ids == [7, 8, 9] and call.logprobs == [-0.5, -0.25, -1.0]
    rid, base = attempt(hostile_server)
    assert ask(base, "stream-good", stream=True).text.endswith("data: [DONE]\n\n")
    call = stored(hostile_server, rid)
    assert call.trainable and call.response_ids == [7, 8] and call.logprobs == [-0.5, -0.25]


@pytest.mark.parametrize(
    ("scenario", "named"),
    [("stream-bad-logprob", "logprob must be a number"), ("stream-misaligned", "2 token ids but 1 log-probs")],
)
def test_a_malformed_stream_reaches_the_agent_whole_and_is_stored_not_trainable(
    hostile_server: str, scenario: str, named: str
) -> None:
    rid, base = attempt(hostile_server)
    resp = ask(base, scenario, stream=True)
    # the agent's 200 was sent with the first bytes: the stream goes on, and the call is kept from training
    assert resp.status_code == 200 and resp.text.endswith("data: [DONE]\n\n")
    call = stored(hostile_server, rid)
    assert (call.trainable, call.status) == (False, "error")
    assert named in (call.error or "")


def test_a_stream_event_past_the_cap_cuts_the_stream(hostile_server: str) -> None:
    rid, base = attempt(hostile_server)
    resp = ask(base, "stream-no-separator", stream=True)
    assert resp.status_code == 200
    assert len(resp.content) < 4 * CAP  # cut soon after the cap, not relayed (and buffered) whole: 8 MB were sent
    # and the agent can tell: the stream ends with an error event (which OpenAI's SDKs raise), not [DONE]
    last = resp.text.rstrip("\n").rsplit("\n\n", 1)[-1]
    assert last.startswith("data: ") and json.loads(last[6:])["error"]["code"] == "upstream_bad_answer", last[:300]
    call = stored(hostile_server, rid)
    assert (call.trainable, call.status) == (False, "error")
    assert "SSE event" in (call.error or "")


@pytest.mark.parametrize(("max_tokens", "cut_by"), [(None, "bytes"), (20, "84 tokens")])
def test_an_endless_stream_is_cut_at_its_total_cap(hostile_server: str, max_tokens: int | None, cut_by: str) -> None:
    """Valid events that never end were relayed and stored whole (615 MB in 25 s): the stream is cut at its total
    cap, in bytes, or in tokens past the request's max_tokens (and 64 of slack), and stored not trainable."""
    rid, base = attempt(hostile_server)
    body: dict[str, Any] = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "stream-endless"}]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    resp = httpx.post(f"{base}/chat/completions", json=body, timeout=60)
    assert resp.status_code == 200
    assert len(resp.content) < 6 * CAP  # the byte cap is 4 × CAP
    last = resp.text.rstrip("\n").rsplit("\n\n", 1)[-1]
    assert last.startswith("data: ") and json.loads(last[6:])["error"]["code"] == "upstream_bad_answer", last[:300]
    call = stored(hostile_server, rid)
    assert (call.trainable, call.status) == (False, "error")
    assert cut_by in (call.error or ""), call.error


@pytest.mark.parametrize(
    ("items", "refusal"),
    [
        # 8 MB of four million numbers: refused before the parse, for the elements it holds (counted in its bytes)
        (b"0", "request body holds at least 4000005 JSON elements"),
        # 12 MB of four million empty lists: refused before the parse (whose share holding the interpreter stalled
        # every other request for seconds), for the structures it opens
        (b"[]", "request body opens 4000002 JSON objects and lists"),
    ],
    ids=["numbers", "empty-lists"],
)
def test_a_large_request_body_is_parsed_off_the_event_loop(tmp_path: Path, items: bytes, refusal: str) -> None:
    """12 MB of four million empty lists took the server seconds to parse and walk; other requests are answered
    meanwhile (orjson's own parse still holds the interpreter, so a short stall remains: hence a ratio)."""
    with ThreadedServer(Hostile(), lifespan="off") as upstream:
        server = start_server(tmp_path / "run", upstream=f"{upstream.url}/v1")
        try:
            _, base = attempt(server.url)
            body = b'{"model":"m","junk":[' + b",".join([items] * 4_000_000) + b"]}"
            latencies: list[float] = []
            stop = threading.Event()

            def probe() -> None:
                with httpx.Client(timeout=60) as http:
                    while not stop.is_set():
                        t = time.monotonic()
                        assert http.get(f"{server.url}/v1/models").status_code == 200
                        latencies.append(time.monotonic() - t)
                        time.sleep(0.02)

            prober = threading.Thread(target=probe)
            prober.start()
            time.sleep(0.3)
            t0 = time.monotonic()
            resp = httpx.post(
                f"{base}/chat/completions", content=body, headers={"content-type": "application/json"}, timeout=120
            )
            took = time.monotonic() - t0
            stop.set()
            prober.join()
        finally:
            server.stop()
    # refused as before, with the same message
    assert resp.status_code == 400
    assert resp.json()["error"]["message"].startswith(refusal)
    # on the loop, one probe waited out the whole parse and walk; off it, at most orjson's share of it
    print(f"slowest probe {max(latencies):.2f} s of {took:.2f} s")
    assert max(latencies) < max(0.6 * took, 0.5), (max(latencies), took)


JSON = {"content-type": "application/json"}


def parts_body(parts: int) -> bytes:
    """A chat request of `parts` text parts of ~100 bytes in one message, then the scenario 'good'."""
    part = {"type": "text", "text": "x" * 80}
    return orjson.dumps(
        {"model": "m", "messages": [{"role": "user", "content": [part] * parts}, {"role": "user", "content": "good"}]}
    )


def test_a_request_of_more_structures_than_the_cap_is_refused_before_its_parse(tmp_path: Path) -> None:
    """A 30 MB chat request of a million one-letter content parts passed the density check (one object per 27
    bytes) and held the interpreter in orjson's parse for about a second, stalling health and every other call:
    past `--max-request-structures` it is refused unparsed, naming the flag."""
    with ThreadedServer(Hostile(), lifespan="off") as upstream:
        server = start_server(
            tmp_path / "run", upstream=f"{upstream.url}/v1", extra_args=["--max-request-structures=4000"]
        )
        try:
            _, base = attempt(server.url)
            under = httpx.post(f"{base}/chat/completions", content=parts_body(3000), headers=JSON, timeout=60)
            _, base = attempt(server.url)
            over = httpx.post(f"{base}/chat/completions", content=parts_body(5000), headers=JSON, timeout=60)
        finally:
            server.stop()
    assert under.status_code == 200, under.text[:300]
    assert over.status_code == 400
    message = over.json()["error"]["message"]
    # 5,000 parts, the body, its list of messages, the two messages and the list of parts
    assert "5005 JSON objects and lists" in message and "--max-request-structures" in message, message
    # the default cap refuses the report's body (scaled down to 5 MB: 185k parts) without parsing it
    assert "--max-request-structures" in str(parse_chat(parts_body(185_000)))
