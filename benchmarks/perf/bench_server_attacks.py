"""`agl serve` under the attacks of issue #27: what each costs in memory and in health latency, before and after.

Each attack runs against a fresh `agl serve` (so each peak RSS is its own), while a thread polls the server's
`GET /api/v1/info` every 50 ms (present in every version, so old and new code are measured alike) and records
the slowest answer and the failures:

- header: one request with a 256 MB header, then four with 48 MB headers at once;
- slowloris: 1,100 connections that stop in the middle of their headers, against a server whose open-file
  limit is 1,024 (as in the report); then whether the server closed them by itself within 15 s;
- otlp: OTLP/protobuf export requests of 100,000 and of 300,000 spans;
- proxy: 3,000 concurrent chat completions through the proxy to an upstream that takes 5 s each;
- long stream (issue #41, N11): one streamed answer of 16k, 32k and 64k tokens (one SSE event each, with ids and
  log-probs, as vLLM sends them), read whole: the server's CPU seconds for it, which grew with the square of the
  length while every other request waited on the event loop.

Run it on this checkout, or on another one's sources with the same environment:

    python benchmarks/perf/bench_server_attacks.py                 # this checkout
    python benchmarks/perf/bench_server_attacks.py --src OLD/packages/core/src --name before
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from _common import report

from agl.common.processes import read_ready_line
from agl.testing.upstream import start_upstream_process

_SERVE = (
    "import resource, sys\n"
    "limit = int(sys.argv[1])\n"
    "if limit: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))\n"
    "from agl.cli.main import main\n"
    "sys.argv = ['agl', 'serve', *sys.argv[2:]]\n"
    "main()\n"
)


class Server:
    def __init__(self, proc: subprocess.Popen[str], url: str) -> None:
        self.proc, self.url = proc, url
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.addr = (host, int(port))

    def cpu_s(self) -> float:
        """The server process's CPU seconds so far (user + system)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def peak_rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")


@contextmanager
def serve(src: str | None, *, fd_limit: int = 0, upstream: str | None = None) -> Iterator[Server]:
    env = {**os.environ}
    if src:
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    with tempfile.TemporaryDirectory(prefix="agl-attack-") as tmp:
        args = [f"--run-dir={tmp}/run", "--port=0", "--log-level=error"]
        if upstream:
            args.append(f"--upstream={upstream}")
        proc = subprocess.Popen(
            [sys.executable, "-c", _SERVE, str(fd_limit), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        try:
            yield Server(proc, read_ready_line(proc, "AGL_SERVER_READY", 60))
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


class Probe:
    """Polls GET /api/v1/info from a thread: the slowest answer and how many failed."""

    def __init__(self, url: str) -> None:
        self.url = f"{url}/api/v1/info"
        self.worst_s = 0.0
        self.failed = 0
        self.answered = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                ok = httpx.get(self.url, timeout=30).status_code == 200
            except httpx.HTTPError:
                ok = False
            self.worst_s = max(self.worst_s, time.monotonic() - t0)
            self.answered += ok
            self.failed += not ok
            self._stop.wait(0.05)

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)


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
    return request.SerializeToString()


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

    proc, upstream = start_upstream_process(delay_s=5.0)
    try:
        with serve(src, upstream=upstream) as server:
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
    finally:
        proc.terminate()
        proc.wait(10)


def attack_long_stream(src: str | None, tokens: int) -> dict[str, Any]:
    proc, upstream = start_upstream_process()
    try:
        with serve(src, upstream=upstream) as server:
            httpx.post(f"{server.url}/api/v1/rollouts", json={"task": {"input": "q"}})
            (c,) = httpx.post(f"{server.url}/api/v1/claims", json={"worker_id": "w", "lease_s": 600}).json()
            url = f"{server.url}/rollout/{c['rollout']['id']}/attempt/{c['attempt']['id']}/v1/chat/completions"
            # the scripted upstream echoes the prompt: "hi " n times is 2n pieces (words and spaces), one event each
            body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi " * (tokens // 2)}]}
            with Probe(server.url) as probe:
                cpu0, t0 = server.cpu_s(), time.monotonic()
                received = 0
                with httpx.stream("POST", url, json=body, timeout=600) as resp:
                    for data in resp.iter_bytes():
                        received += len(data)
                elapsed, cpu = time.monotonic() - t0, server.cpu_s() - cpu0
            return {
                "tokens": tokens,
                "bytes streamed (MB)": received / 2**20,
                "seconds": elapsed,
                "server CPU (s)": cpu,
                "health: slowest (s)": probe.worst_s,
                "health: failed": probe.failed,
            }
    finally:
        proc.terminate()
        proc.wait(10)


def smoke() -> None:
    """`make bench-smoke`: that every attack still runs, each at a small size (the numbers are not judged)."""
    report("server_attack_header_smoke", attack_header(None, big_mb=2, small_mb=1))
    report("server_attack_slowloris_smoke", attack_slowloris(None, connections=40))
    report("server_attack_otlp_smoke", attack_otlp(None, 1_000))
    report("server_attack_proxy_smoke", attack_proxy(None, calls=40, attempts=10))
    report("server_attack_long_stream_smoke", attack_long_stream(None, 2_000))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", help="agl-core sources to run the server from (default: the installed agl)")
    parser.add_argument("--name", default="after", help="suffix of the result files")
    parser.add_argument("--only", choices=["header", "slowloris", "otlp", "proxy", "long-stream"], action="append")
    args = parser.parse_args()
    chosen = set(args.only or ["header", "slowloris", "otlp", "proxy", "long-stream"])
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


if __name__ == "__main__":
    main()
