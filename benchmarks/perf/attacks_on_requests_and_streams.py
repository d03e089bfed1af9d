"""Attacks on `agl serve`'s requests and streams (slow bodies, trailers, span and proxy body amplification, stalled
readers under a hold, a hostile upstream, a health flood), run by bench_server_attacks.py; each returns the figures
it prints."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from _common import (
    Probe,
    Server,
    claim_attempt,
    long_answer_body,
    percentile,
    scripted_upstream,
    serve,
)

from agl.common.processes import read_ready_line


def cpu_s(server: Server) -> float:
    """The server's CPU seconds so far (NaN once it was killed)."""
    try:
        return server.cpu_s()
    except OSError:
        return float("nan")


def peak_mb(server: Server) -> float:
    """The server's peak RSS (NaN once it was killed)."""
    try:
        return server.peak_rss_mb()
    except OSError:
        return float("nan")


def first_line(sock: socket.socket) -> str:
    """The first line of what the server answered on `sock`, or how the connection ended."""
    try:
        return sock.recv(200).split(b"\r\n", 1)[0].decode(errors="replace") or "closed"
    except OSError as exc:
        return type(exc).__name__


def attack_slow_body(
    src: str | None, connections: int = 384, max_connections: int = 256, seconds: float = 75.0, every_s: float = 2.0
) -> dict[str, Any]:
    head = (
        b"POST /api/v1/tasks HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
        b"content-length: 1000\r\n\r\n"
    )
    with serve(src, extra=(f"--max-connections={max_connections}",)) as server:
        socks: dict[int, socket.socket] = {}
        refused = 0
        for _ in range(connections):
            try:
                sock = socket.create_connection(server.addr, timeout=5)
                sock.sendall(head)
                socks[sock.fileno()] = sock
            except OSError:
                refused += 1
        poller = select.poll()
        for fd in socks:
            poller.register(fd, select.POLLIN)
        cut: dict[int, tuple[float, str]] = {}  # fd: (seconds after the last opened, the answer)
        start = time.monotonic()
        end, next_send = start + seconds, start
        with Probe(server.url, server) as probe:
            while (now := time.monotonic()) < end:
                if now >= next_send:
                    for fd, sock in socks.items():
                        if fd not in cut:
                            try:
                                sock.sendall(b" ")
                            except OSError:
                                pass
                    next_send += every_s
                for fd, _ in poller.poll(max(0.0, min(next_send, end) - time.monotonic()) * 1000):
                    cut[fd] = (time.monotonic() - start, first_line(socks[fd]))
                    poller.unregister(fd)
        peak = peak_mb(server)
    for sock in socks.values():
        sock.close()
    shed = [answer for t, answer in cut.values() if t < 5]
    timed_out = sorted(t for t, _ in cut.values() if t >= 5)
    return {
        "connections opened": len(socks),
        "connections refused": refused,
        **probe.rows(),
        "cut within 5 s (at the cap): answers": dict(Counter(shed)),
        "cut later: answers": dict(Counter(answer for t, answer in cut.values() if t >= 5)),
        "cut later: first/last after (s)": f"{timed_out[0]:.1f} / {timed_out[-1]:.1f}" if timed_out else "-",
        f"still open after {seconds:.0f} s": len(socks) - len(cut),
        "peak RSS (MB)": peak,
    }


def big_trailer(addr: tuple[str, int], megabytes: int) -> tuple[str, float]:
    """A chunked POST with one `megabytes`-long trailer field, sent in 64 KiB writes until the server closes: the
    first line of the answer (or how the connection ended) and the MB sent."""
    body = b'{"input": 1}'
    sent = 0
    with socket.create_connection(addr, timeout=300) as sock:
        sock.sendall(
            b"POST /api/v1/tasks HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
            b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\nx-big: " % (len(body), body)
        )
        block = b"a" * 65536
        try:
            while sent < megabytes << 20:
                sock.sendall(block)
                sent += len(block)
            sock.sendall(b"\r\n\r\n")
        except OSError:
            pass
        return first_line(sock), sent / 2**20


def attack_trailers(src: str | None, megabytes: int) -> dict[str, Any]:
    with serve(src) as server, Probe(server.url, server) as probe:
        before, cpu0, t0 = peak_mb(server), cpu_s(server), time.monotonic()
        answer, sent_mb = big_trailer(server.addr, megabytes)
        elapsed, cpu = time.monotonic() - t0, cpu_s(server) - cpu0
        peak = peak_mb(server)
    return {
        "trailer field (MB)": megabytes,
        "answer": answer,
        "sent before the server closed (MB)": sent_mb,
        "seconds": elapsed,
        "server CPU (s)": cpu,
        "peak RSS growth (MB)": peak - before,
        **probe.rows(),
    }


def varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def empty_spans(kind: str, n: int) -> tuple[str, bytes, str]:
    """(path, body, content type) of a request carrying `n` empty spans: `otlp-protobuf` (2 bytes a span),
    `otlp-json` or `rest` (3 bytes a span)."""
    if kind == "otlp-protobuf":  # ExportTraceServiceRequest.resource_spans (1) > .scope_spans (2) > .spans (2)
        spans = b"\x12\x00" * n
        scope = b"\x12" + varint(len(spans)) + spans
        return "/v1/traces", b"\x0a" + varint(len(scope)) + scope, "application/x-protobuf"
    items = b"{}," * (n - 1) + b"{}"
    if kind == "otlp-json":
        return "/v1/traces", b'{"resourceSpans":[{"scopeSpans":[{"spans":[' + items + b"]}]}]}", "application/json"
    return "/api/v1/spans", b'{"spans":[' + items + b"]}", "application/json"


def attack_spans(src: str | None, kind: str, n: int) -> dict[str, Any]:
    path, body, content_type = empty_spans(kind, n)
    with serve(src) as server:
        before = peak_mb(server)
        with Probe(server.url, server) as probe:
            cpu0, t0 = cpu_s(server), time.monotonic()
            try:
                status: int | str = httpx.post(
                    f"{server.url}{path}", content=body, headers={"content-type": content_type}, timeout=600
                ).status_code
            except httpx.HTTPError as exc:
                status = type(exc).__name__
            elapsed, cpu = time.monotonic() - t0, cpu_s(server) - cpu0
        return {
            "request": f"{kind}: {n:,} empty spans in {len(body) / 1e6:.1f} MB",
            "status": status,
            "seconds": elapsed,
            "server CPU (s)": cpu,
            "peak RSS growth (MB)": peak_mb(server) - before,
            **probe.rows(),
        }


def many_parts_body(megabytes: float) -> bytes:
    """A chat completion of ~`megabytes` MB: one user message of as many one-letter text parts as fit, and an
    answer of one token (the scripted upstream echoes the prompt: without a cap its answer would be 5× the body)."""
    part = b'{"type":"text","text":"a"},'
    n = int(megabytes * 1e6) // len(part)
    return b'{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[' + part * (n - 1) + part[:-1] + b"]}]}"


def attack_proxy_body(src: str | None, megabytes: float) -> dict[str, Any]:
    body = many_parts_body(megabytes)
    with scripted_upstream() as upstream, serve(src, upstream=upstream) as server:
        url = f"{claim_attempt(server.url)}/chat/completions"
        before = peak_mb(server)
        with Probe(server.url, server) as probe:
            cpu0, t0 = cpu_s(server), time.monotonic()
            try:
                resp = httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=600)
                status: int | str = f"{resp.status_code} {resp.text[:150]!r}" if resp.is_error else resp.status_code
            except httpx.HTTPError as exc:
                status = type(exc).__name__
            elapsed, cpu = time.monotonic() - t0, cpu_s(server) - cpu0
        return {
            "body (MB)": len(body) / 1e6,
            "content parts": body.count(b'"type"'),
            "status": status,
            "seconds": elapsed,
            "server CPU (s)": cpu,
            "peak RSS growth (MB)": peak_mb(server) - before,
            **probe.rows(),
        }


def was_cut(sock: socket.socket, within_s: float = 2.0) -> bool:
    """Read what `sock` holds until the connection ends (True: the server had closed or reset it) or nothing more
    comes for 0.5 s or `within_s` have passed (False: it is still open, the answer still coming or waiting)."""
    deadline = time.monotonic() + within_s
    sock.settimeout(0.5)
    try:
        while time.monotonic() < deadline:
            if not sock.recv(1 << 20):
                return True
    except TimeoutError:
        return False
    except OSError:
        return True
    return False


def socket_count(pid: int) -> int:
    """How many sockets process `pid` holds open."""
    fds = Path(f"/proc/{pid}/fd")
    return sum(os.readlink(fds / fd).startswith("socket:") for fd in os.listdir(fds))


def stalled_stream(addr: tuple[str, int], path: str, body: bytes) -> socket.socket:
    """POST a streamed chat completion from a socket with a 4 KiB receive buffer that never reads its answer."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(addr)
    sock.sendall(
        b"POST %s HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
        % (path.encode(), len(body))
        + body
    )
    return sock


def attack_stalled_hold(
    src: str | None, clients: int = 20, tokens: int = 64_000, settle_s: float = 8.0, cap_s: float = 90.0
) -> dict[str, Any]:
    with scripted_upstream() as upstream, serve(src, upstream=upstream) as server:
        httpx.post(f"{server.url}/api/v1/rollouts", json={"task": {"input": "q"}, "n": clients + 1})
        claims = httpx.post(
            f"{server.url}/api/v1/claims", json={"worker_id": "w", "max_rollouts": clients + 1, "lease_s": 3600}
        ).json()
        paths = [f"/rollout/{c['rollout']['id']}/attempt/{c['attempt']['id']}/v1/chat/completions" for c in claims]
        body = json.dumps(long_answer_body(tokens)).encode()
        before = peak_mb(server)
        sockets_before = socket_count(server.proc.pid)
        stalled = [stalled_stream(server.addr, path, body) for path in paths[:clients]]
        time.sleep(settle_s)  # until every answer fills the buffers on its way
        hold: dict[str, Any] = {}
        other: dict[str, Any] = {}

        def trainer() -> None:
            t0 = time.monotonic()
            try:
                resp = httpx.post(f"{server.url}/api/v1/proxy/hold?drain_timeout_s=600", json={}, timeout=cap_s)
                hold["answer"] = resp.status_code
            except httpx.TimeoutException:
                hold["answer"] = f"none within {cap_s:.0f} s"
            hold["seconds"] = time.monotonic() - t0
            httpx.post(f"{server.url}/api/v1/proxy/release", json={}, timeout=30)

        def agent() -> None:
            t0 = time.monotonic()
            try:
                request = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
                other["answer"] = httpx.post(f"{server.url}{paths[-1]}", json=request, timeout=cap_s).status_code
            except httpx.TimeoutException:
                other["answer"] = f"none within {cap_s:.0f} s"
            other["seconds"] = time.monotonic() - t0

        with Probe(server.url, server) as probe:
            threads = [threading.Thread(target=trainer), threading.Thread(target=agent)]
            threads[0].start()
            time.sleep(0.5)  # the hold first, then the call it holds back
            threads[1].start()
            for t in threads:
                t.join()
            sockets_at_end = socket_count(server.proc.pid)
        peak = peak_mb(server)
        cut = sum(was_cut(s) for s in stalled)
    for sock in stalled:
        sock.close()
    wait = other["seconds"]
    return {
        "stalled streams (tokens each)": f"{clients} ({tokens:,})",
        "hold: answer": hold["answer"],
        "hold: seconds": hold["seconds"],
        "other agent's call: answer": other["answer"],
        "other agent's call: waited (s)": f">= {cap_s:.0f}" if wait >= cap_s else wait,
        "stalled clients cut by the end": f"{cut} of {clients}",
        "server's sockets at the end, more than before the streams": sockets_at_end - sockets_before,
        "peak RSS growth (MB)": peak - before,
        **probe.rows(),
    }


# An upstream that answers every request with a `size`-byte body: `json` (one JSON object, content-length
# given) or `sse` (a text/event-stream of one event that never ends: no blank line), in 64 KiB writes
_HOSTILE_UPSTREAM = r"""
import asyncio, sys
mode, size = sys.argv[1], int(sys.argv[2])

async def handle(reader, writer):
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        await reader.readexactly(length)
        if mode == "json":
            prefix = b'{"id":"x","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,'
            prefix += b'"message":{"role":"assistant","content":"'
            suffix = b'"},"finish_reason":"stop"}]}'
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % size)
        else:
            prefix, suffix = b"data: ", b""
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
        writer.write(prefix)
        left = size - len(prefix) - len(suffix)
        block = b"a" * 65536
        while left > 0:
            writer.write(block[:left])
            left -= len(block)
            await writer.drain()
        writer.write(suffix)
        await writer.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()

async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print("HOSTILE_READY http://127.0.0.1:%d/v1" % server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()

asyncio.run(main())
"""


def attack_hostile_upstream(src: str | None, mode: str, megabytes: int) -> dict[str, Any]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOSTILE_UPSTREAM, mode, str(megabytes * 2**20)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        upstream = read_ready_line(proc, "HOSTILE_READY", 30)
        with serve(src, upstream=upstream) as server:
            url = f"{claim_attempt(server.url)}/chat/completions"
            request = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": mode == "sse"}
            before = peak_mb(server)
            received, ending, status, tail = 0, "whole", 0, b""
            with Probe(server.url, server) as probe:
                t0 = time.monotonic()
                try:
                    with httpx.stream("POST", url, json=request, timeout=300) as resp:
                        status = resp.status_code
                        for data in resp.iter_bytes():
                            received += len(data)
                            tail = (tail + data)[-150:]
                except httpx.HTTPError as exc:
                    ending = f"cut ({type(exc).__name__})"
                elapsed = time.monotonic() - t0
            return {
                "upstream answers": f"{megabytes} MB of {'one JSON object' if mode == 'json' else 'SSE, no separator'}",
                "status to the agent": status,
                "answer to the agent (MB)": f"{received / 2**20:.3f}, {ending}",
                "its last bytes": repr(tail[-100:]),
                "seconds": elapsed,
                "peak RSS growth (MB)": peak_mb(server) - before,
                **probe.rows(),
            }
    finally:
        proc.kill()
        proc.wait(10)


# `threads` threads GET /healthz back to back (each on a kept-alive connection) from `start` (time.time()) for
# `seconds`; prints how many answered, by status
_HEALTH_FLOOD = r"""
import collections, sys, threading, time
import httpx
url, threads, start, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
statuses = collections.Counter()

def run():
    with httpx.Client(timeout=30) as client:
        time.sleep(max(0.0, start - time.time()))
        while time.time() < start + seconds:
            try:
                statuses[client.get(url).status_code] += 1
            except httpx.HTTPError as exc:
                statuses[type(exc).__name__] += 1

workers = [threading.Thread(target=run) for _ in range(threads)]
for w in workers:
    w.start()
for w in workers:
    w.join()
print(dict(statuses), flush=True)
"""


def task_writes(url: str, seconds: float) -> list[float]:
    """POST /api/v1/tasks one after another for `seconds`: each write's latency."""
    latencies: list[float] = []
    with httpx.Client(timeout=60) as client:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.monotonic()
            client.post(f"{url}/api/v1/tasks", json={"input": len(latencies)}).raise_for_status()
            latencies.append(time.monotonic() - t0)
    return latencies


def attack_health_flood(src: str | None, threads: int = 8, seconds: float = 10.0) -> dict[str, Any]:
    with serve(src) as server:
        quiet = task_writes(server.url, seconds)
        start = time.time() + 2.0  # the flood's process has imported httpx and opened its connections by then
        flood = subprocess.Popen(
            [sys.executable, "-c", _HEALTH_FLOOD, f"{server.url}/healthz", str(threads), str(start), str(seconds)],
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(max(0.0, start - time.time()))
        flooded = task_writes(server.url, seconds)
        floods, _ = flood.communicate(timeout=seconds + 120)
        peak = peak_mb(server)
    return {
        "flood": f"{threads} threads, {seconds:.0f} s",
        "health answers in the flood (by status)": floods.strip(),
        "writes alone: count": len(quiet),
        "writes alone: p50 / p99 (ms)": f"{percentile(quiet, 0.5) * 1e3:.2f} / {percentile(quiet, 0.99) * 1e3:.2f}",
        "writes in the flood: count": len(flooded),
        "writes in the flood: p50 / p99 (ms)": (
            f"{percentile(flooded, 0.5) * 1e3:.2f} / {percentile(flooded, 0.99) * 1e3:.2f}"
        ),
        "p50 in the flood / p50 alone": percentile(flooded, 0.5) / percentile(quiet, 0.5),
        "peak RSS (MB)": peak,
    }
