"""Attacks through the proxy's engines (engine URLs, a loop back to agl, engines dead or answering garbage, a stream
that never ends), run by bench_engine_attacks.py; each returns the figures it prints. Every server runs from the
sources given (`src`), old or new, on its default options."""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import orjson
from _common import Probe, claim_attempt, scripted_upstream, serve

ENGINES = "/api/v1/proxy/engines"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
BAD_URLS = {
    "cloud metadata": "http://169.254.169.254/latest/meta-data",
    "user and password": "http://user:pw@127.0.0.1:9/v1",
    "NUL byte": "http://127.0.0.1:9/v1\u0000x",
    "dot segments": "http://127.0.0.1:9/v1/../../admin",
    "query": "http://127.0.0.1:9/v1?x=1",
    "fragment": "http://127.0.0.1:9/v1#x",
}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stored_calls(url: str) -> int:
    return int(httpx.get(f"{url}/api/v1/stats", timeout=30).json()["counts"]["llm_calls"])


def attack_engine_urls(src: str | None) -> dict[str, Any]:
    """Each bad URL offered to a loopback server without a token, by a process holding no token at all."""
    with scripted_upstream() as upstream, serve(src, upstream=upstream) as server:
        answers = {
            name: httpx.post(f"{server.url}{ENGINES}", json={"url": url}, timeout=30).status_code
            for name, url in BAD_URLS.items()
        }
        added = [e["url"] for e in httpx.get(f"{server.url}{ENGINES}", timeout=30).json()][1:]
    accepted = [name for name, status in answers.items() if status < 300]
    return {"bad engine URLs accepted": f"{len(accepted)} of {len(BAD_URLS)}", "engines added": len(added)}


def attack_loop(src: str | None, wait_s: float = 30.0) -> dict[str, Any]:
    """A local process with no token makes an attempt's own proxy URL the only engine, then makes one call there:
    how many calls it became."""
    with scripted_upstream() as upstream, serve(src, upstream=upstream) as server:
        base = claim_attempt(server.url)
        added = httpx.post(f"{server.url}{ENGINES}", json={"url": base}, timeout=30).status_code
        removed = httpx.post(f"{server.url}{ENGINES}/remove", json={"url": upstream}, timeout=30).status_code
        t0 = time.monotonic()
        try:
            status: Any = httpx.post(f"{base}/chat/completions", json=CHAT, timeout=wait_s).status_code
        except httpx.HTTPError as exc:
            status = type(exc).__name__
        answered_s = time.monotonic() - t0
        try:
            in_flight: Any = httpx.get(f"{server.url}/api/v1/proxy/usage", timeout=30).json()["in_flight"]
            stored: Any = stored_calls(server.url)
        except httpx.HTTPError as exc:
            in_flight = stored = type(exc).__name__
        return {
            "adding the loop (status)": added,
            "removing the real engine (status)": removed,
            "the agent's answer": status,
            "answered in (s)": answered_s,
            "calls stored": stored,
            "calls in flight after": in_flight,
        }


def attack_dead_engines(src: str | None) -> dict[str, Any]:
    """Three engines, none reachable (vLLM servers restarting together): the agent's answer and what is stored."""
    dead = tuple(f"--upstream=http://127.0.0.1:{closed_port()}/v1" for _ in range(3))
    with serve(src, extra=dead) as server:
        base = claim_attempt(server.url)
        answer = httpx.post(f"{base}/chat/completions", json=CHAT, timeout=60)
        return {"the agent's answer": answer.status_code, "calls stored": stored_calls(server.url)}


class _Garbage(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        body = b"<html>502 from a load balancer</html>"
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def garbage_engine() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Garbage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def attack_garbage_engine(src: str | None, attempts: int = 20) -> dict[str, Any]:
    """A good engine and one answering garbage: 20 new attempts, one call each, one after another."""
    with (
        scripted_upstream() as good,
        garbage_engine() as bad,
        serve(src, extra=(f"--upstream={good}", f"--upstream={bad}")) as server,
    ):
        statuses = Counter(
            httpx.post(f"{claim_attempt(server.url)}/chat/completions", json=CHAT, timeout=60).status_code
            for _ in range(attempts)
        )
        usage = next(e for e in httpx.get(f"{server.url}{ENGINES}", timeout=30).json() if e["url"] == bad)
    return {
        "answers": dict(sorted(statuses.items())),
        "garbage engine: failures counted": usage["failures"],
        "garbage engine: in rotation after": usage["in_rotation"],
    }


def endless_stream_upstream() -> tuple[ThreadingHTTPServer, str]:
    """An upstream whose streamed answer is valid events, one token each, that never end."""

    class Endless(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            first = {"choices": [{"index": 0, "delta": {"content": "x"}, "token_ids": [7], "logprobs": None}]}
            first["prompt_token_ids"] = [1, 2, 3]
            event = b"data: " + orjson.dumps({**first, "prompt_token_ids": None}) + b"\n\n"
            block = b"data: " + orjson.dumps(first) + b"\n\n" + event * 200
            try:
                while True:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(block), block))
                    block = event * 200
            except OSError:
                return

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Endless)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"


def attack_endless_stream(src: str | None, seconds: float = 25.0) -> dict[str, Any]:
    """One streamed call whose upstream never stops: what reaches the agent in `seconds`, and the server's memory."""
    upstream, url = endless_stream_upstream()
    try:
        with serve(src, upstream=url) as server, Probe(server.url, server) as probe:
            base = claim_attempt(server.url)
            received, t0 = 0, time.monotonic()
            try:
                with httpx.stream(
                    "POST", f"{base}/chat/completions", json={**CHAT, "stream": True}, timeout=60
                ) as resp:
                    for data in resp.iter_bytes():
                        received += len(data)
                        if time.monotonic() - t0 > seconds:
                            break
            except httpx.HTTPError:
                pass
            ended_s = time.monotonic() - t0
            time.sleep(1.0)
            return {
                "MB relayed to the agent": received / 2**20,
                "stream ended after (s)": ended_s,
                "server peak RSS (MB)": server.peak_rss_mb(),
                **probe.rows(),
            }
    finally:
        upstream.shutdown()
        upstream.server_close()
