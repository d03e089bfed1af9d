"""`agl serve` under the attacks of issues #27 and #41: what each costs in memory and health latency, before and after.

Each attack runs against a fresh `agl serve` (so each peak RSS is its own), while a thread polls the server's
`GET /api/v1/info` every 50 ms, on a new connection each time (present in every version, so old and new code
are measured alike), and records the slowest answer and the failures:

- header: one request with a 256 MB header, then four with 48 MB headers at once;
- slowloris: 1,100 connections that stop in the middle of their headers, against a server whose open-file
  limit is 1,024 (as in the report); then whether the server closed them by itself within 15 s;
- otlp: OTLP/protobuf export requests of 100,000 and of 300,000 spans;
- proxy: 3,000 concurrent chat completions through the proxy to an upstream that takes 5 s each;
- long stream (issue #41, N11): one streamed answer of 16k, 32k and 64k tokens (one SSE event each, with ids and
  log-probs, as vLLM sends them), read whole: the server's CPU seconds for it, which grew with the square of the
  length while every other request waited on the event loop.

And the attacks of issue #41 (the probe also gives its 99th percentile; failures are counted by kind):

- slow body: 384 connections that send their headers (a POST of 1,000 bytes) and then one byte of body every
  2 s, against a server capped at 256 connections (`--max-connections`, an option of every version), for 75 s:
  the health probe's failures, and which connections the server cut, when, and with what answer;
- trailers: one chunked POST whose trailer field is 64 MB, then (another server) 128 MB, sent in 64 KiB writes
  until the server closes: the answer, the server's CPU seconds and its peak RSS;
- spans: 10,000,000 empty spans in a 20 MB OTLP protobuf, in a 30 MB OTLP JSON, and in a 30 MB
  `POST /api/v1/spans`: what a small body becomes once decoded;
- proxy body: a 12 MB and a 30 MB chat completion of 444,000 and 1,111,000 one-letter content parts through the
  proxy (`--max-body-mb` is 32), answered with one token: the health latency while the proxy parses it;
- stalled hold: 20 streamed answers of 64k tokens whose clients never read (a 4 KiB receive buffer), then a
  trainer's `POST /api/v1/proxy/hold?drain_timeout_s=600` (released as soon as it answers) while another agent
  makes an ordinary call: how long that call waited (the wait is capped at 90 s), whether the stalled clients
  were cut, the hold's answer;
- hostile upstream: an upstream that answers a 200 MB JSON body, and one that streams 87 MB with no SSE event
  separator: what the agent gets, and the server's memory;
- health flood: 8 threads hammering `GET /healthz` (another process) for 10 s while one client writes tasks
  one after another: the writes' latency with and without the flood.

And the attacks through the proxy's engines (attacks_on_engines.py):

- engine URLs: six malformed or dangerous engine URLs (cloud metadata, user and password, a NUL byte, dot
  segments, a query, a fragment) offered to a loopback server without a token, by a process with no token;
- engine loop: one chat call through a server whose only engine leads back to itself;
- dead engines: three engines, none reachable: the agent's answer and the calls stored;
- garbage engine: a good engine and one answering 200 with HTML: 20 new attempts, one call each;
- endless stream: an upstream streaming valid one-token events forever: what reaches the agent in 25 s and the
  server's peak memory.

Every attack runs on the servers' default options (besides `--max-connections` above), old and new alike.

Run it on this checkout, or on another one's sources with the same environment:

    python benchmarks/perf/bench_server_attacks.py                 # this checkout
    python benchmarks/perf/bench_server_attacks.py --src OLD/packages/core/src --name before
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import threading
import time
from collections import Counter
from typing import Any

import httpx
from _common import (
    Probe,
    claim_attempt,
    long_answer_body,
    report,
    scripted_upstream,
    serve,
    stream_answer,
)
from attacks_on_engines import (
    attack_dead_engines,
    attack_endless_stream,
    attack_engine_urls,
    attack_garbage_engine,
    attack_loop,
)
from attacks_on_requests_and_streams import (
    attack_health_flood,
    attack_hostile_upstream,
    attack_proxy_body,
    attack_slow_body,
    attack_spans,
    attack_stalled_hold,
    attack_trailers,
)


def huge_header(addr: tuple[str, int], megabytes: int) -> str:
    """Send a `megabytes`-long header; the first line of the answer (or how the connection ended)."""
    with socket.create_connection(addr, timeout=180) as sock:
        sock.sendall(b"GET /api/v1/info HTTP/1.1\r\nhost: localhost\r\nx-big: ")
        try:
            for _ in range(megabytes):
                sock.sendall(b"a" * (1 << 20))
            sock.sendall(b"\r\n\r\n")
        except OSError:
            pass
        try:
            return sock.recv(200).split(b"\r\n", 1)[0].decode(errors="replace") or "closed"
        except OSError as exc:
            return type(exc).__name__


def attack_header(src: str | None, big_mb: int = 256, small_mb: int = 48) -> dict[str, Any]:
    with serve(src) as server, Probe(server.url) as probe:
        before = server.peak_rss_mb()
        t0 = time.monotonic()
        one = huge_header(server.addr, big_mb)
        one_s = time.monotonic() - t0
        answers: list[str] = []
        threads = [
            threading.Thread(target=lambda: answers.append(huge_header(server.addr, small_mb))) for _ in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        peak = server.peak_rss_mb()
    return {
        "256 MB header: answer": one,
        "256 MB header: seconds": one_s,
        "4 x 48 MB headers: answers": dict(Counter(answers)),
        "peak RSS growth (MB)": peak - before,
        "health: slowest (s)": probe.worst_s,
        "health: failed": probe.failed,
    }


def attack_slowloris(src: str | None, connections: int = 1100) -> dict[str, Any]:
    with serve(src, fd_limit=1024) as server:
        stalled: list[socket.socket] = []
        refused = 0
        for _ in range(connections):
            try:
                sock = socket.create_connection(server.addr, timeout=5)
                sock.sendall(b"GET /api/v1/info HTTP/1.1\r\nhost: loc")
                stalled.append(sock)
            except OSError:
                refused += 1
        with Probe(server.url) as probe:
            time.sleep(3)
        closed = 0
        deadline = time.monotonic() + 15
        for sock in stalled:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                closed += sock.recv(100) is not None
            except OSError:
                pass
        for sock in stalled:
            sock.close()
        return {
            "connections opened": len(stalled),
            "connections refused": refused,
            "health while held: answered": probe.answered,
            "health while held: failed": probe.failed,
            "health while held: slowest (s)": probe.worst_s,
            "stalled connections the server closed within 15 s": closed,
            "peak RSS (MB)": server.peak_rss_mb(),
        }


def otlp_body(n: int) -> bytes:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    now = time.time_ns()
    for i in range(n):
        span = spans.add()
        span.trace_id = (i + 1).to_bytes(16, "big")
        span.span_id = (i + 1).to_bytes(8, "big")
        span.name = f"span {i}"
        span.start_time_unix_nano = now
        span.end_time_unix_nano = now + 1000
    return bytes(request.SerializeToString())


def attack_otlp(src: str | None, n: int) -> dict[str, Any]:
    body = otlp_body(n)
    with serve(src) as server:
        before = server.peak_rss_mb()
        with Probe(server.url) as probe:
            t0 = time.monotonic()
            resp = httpx.post(
                f"{server.url}/v1/traces",
                content=body,
                headers={"content-type": "application/x-protobuf"},
                timeout=300,
            )
            elapsed = time.monotonic() - t0
        return {
            "body (MB)": len(body) / 1e6,
            "status": resp.status_code,
            "seconds": elapsed,
            "peak RSS growth (MB)": server.peak_rss_mb() - before,
            "health: slowest (s)": probe.worst_s,
            "health: failed": probe.failed,
        }


def attack_proxy(src: str | None, calls: int = 3000, attempts: int = 100) -> dict[str, Any]:
    import aiohttp

    with scripted_upstream(delay_s=5.0) as upstream, serve(src, upstream=upstream) as server:
        httpx.post(f"{server.url}/api/v1/rollouts", json={"task": {"input": "q"}, "n": attempts})
        claims = httpx.post(
            f"{server.url}/api/v1/claims", json={"worker_id": "w", "max_rollouts": attempts, "lease_s": 600}
        ).json()
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

        async def burst() -> Counter[int]:
            timeout = aiohttp.ClientTimeout(total=300)
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as s:

                async def one(i: int) -> int:
                    c = claims[i % len(claims)]
                    url = f"{server.url}/rollout/{c['rollout']['id']}/attempt/{c['attempt']['id']}/v1"
                    try:
                        async with s.post(f"{url}/chat/completions", json=body) as resp:
                            await resp.read()
                            return resp.status
                    except aiohttp.ClientError:
                        return 0

                return Counter(await asyncio.gather(*(one(i) for i in range(calls))))

        with Probe(server.url) as probe:
            t0 = time.monotonic()
            statuses = asyncio.run(burst())
            elapsed = time.monotonic() - t0
        return {
            "calls": calls,
            "statuses (0: connection failed)": dict(sorted(statuses.items())),
            "seconds": elapsed,
            "peak RSS (MB)": server.peak_rss_mb(),
            "health: slowest (s)": probe.worst_s,
            "health: failed": probe.failed,
        }


def attack_long_stream(src: str | None, tokens: int) -> dict[str, Any]:
    with scripted_upstream() as upstream, serve(src, upstream=upstream) as server:
        url = f"{claim_attempt(server.url)}/chat/completions"
        with Probe(server.url) as probe:
            cpu0, t0 = server.cpu_s(), time.monotonic()
            received = stream_answer(url, long_answer_body(tokens))
            elapsed, cpu = time.monotonic() - t0, server.cpu_s() - cpu0
        return {
            "tokens": tokens,
            "bytes streamed (MB)": received / 2**20,
            "seconds": elapsed,
            "server CPU (s)": cpu,
            "health: slowest (s)": probe.worst_s,
            "health: failed": probe.failed,
        }


# ------------------------------------------------------------------------------------------ issue #41's attacks


def smoke() -> None:
    """`make bench-smoke`: that every attack still runs, each at a small size (the numbers are not judged)."""
    report("server_attack_header_smoke", attack_header(None, big_mb=2, small_mb=1))
    report("server_attack_slowloris_smoke", attack_slowloris(None, connections=40))
    report("server_attack_otlp_smoke", attack_otlp(None, 1_000))
    report("server_attack_proxy_smoke", attack_proxy(None, calls=40, attempts=10))
    report("server_attack_long_stream_smoke", attack_long_stream(None, 2_000))
    report("server_attack_trailers_smoke", attack_trailers(None, 1))


ATTACKS = [
    "header",
    "slowloris",
    "otlp",
    "proxy",
    "long-stream",
    "slow-body",
    "trailers",
    "spans",
    "proxy-body",
    "stalled-hold",
    "hostile-upstream",
    "health-flood",
    "engine-urls",
    "engine-loop",
    "dead-engines",
    "garbage-engine",
    "endless-stream",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", help="agl-core sources to run the server from (default: the installed agl)")
    parser.add_argument("--name", default="after", help="suffix of the result files")
    parser.add_argument("--only", choices=ATTACKS, action="append")
    args = parser.parse_args()
    chosen = set(args.only or ATTACKS)
    if "header" in chosen:
        report(f"server_attack_header_{args.name}", attack_header(args.src))
    if "slowloris" in chosen:
        report(f"server_attack_slowloris_{args.name}", attack_slowloris(args.src))
    if "otlp" in chosen:
        for n in (100_000, 300_000):
            report(f"server_attack_otlp_{n}_{args.name}", attack_otlp(args.src, n))
    if "proxy" in chosen:
        report(f"server_attack_proxy_{args.name}", attack_proxy(args.src))
    if "long-stream" in chosen:
        for tokens in (16_000, 32_000, 64_000):
            report(f"server_attack_long_stream_{tokens}_{args.name}", attack_long_stream(args.src, tokens))
    if "slow-body" in chosen:
        report(f"server_attack_slow_body_{args.name}", attack_slow_body(args.src))
    if "trailers" in chosen:
        for mb in (64, 128):
            report(f"server_attack_trailers_{mb}_{args.name}", attack_trailers(args.src, mb))
    if "spans" in chosen:
        for kind, n in (("otlp-protobuf", 10_000_000), ("otlp-json", 10_000_000), ("rest", 10_000_000)):
            report(f"server_attack_spans_{kind}_{args.name}", attack_spans(args.src, kind, n))
    if "proxy-body" in chosen:
        for mb in (3.5, 12, 30):  # 3.5 MB: 129k parts, just under --max-request-structures
            report(f"server_attack_proxy_body_{mb}_{args.name}", attack_proxy_body(args.src, mb))
    if "stalled-hold" in chosen:
        report(f"server_attack_stalled_hold_{args.name}", attack_stalled_hold(args.src))
    if "hostile-upstream" in chosen:
        for mode, mb in (("json", 200), ("sse", 87)):
            report(f"server_attack_hostile_upstream_{mode}_{args.name}", attack_hostile_upstream(args.src, mode, mb))
    if "health-flood" in chosen:
        report(f"server_attack_health_flood_{args.name}", attack_health_flood(args.src))
    if "engine-urls" in chosen:
        report(f"server_attack_engine_urls_{args.name}", attack_engine_urls(args.src))
    if "engine-loop" in chosen:
        report(f"server_attack_engine_loop_{args.name}", attack_loop(args.src))
    if "dead-engines" in chosen:
        report(f"server_attack_dead_engines_{args.name}", attack_dead_engines(args.src))
    if "garbage-engine" in chosen:
        report(f"server_attack_garbage_engine_{args.name}", attack_garbage_engine(args.src))
    if "endless-stream" in chosen:
        report(f"server_attack_endless_stream_{args.name}", attack_endless_stream(args.src))


if __name__ == "__main__":
    main()
