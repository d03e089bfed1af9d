"""Every phase of a request is bounded (issue #41), each against a real `agl serve` process over raw sockets:

- N12: a body that never arrives is answered 408 after `--body-timeout`, and connections trickling their bodies
  are shed at the connection cap like those trickling their headers, so health keeps answering;
- N13: chunked trailers count against the header cap (431), in bounded memory;
- N15: a client that stops reading its streamed answer is cut after `--send-timeout`, and its call stored as
  abandoned, while it still holds its connection open;
- N4: span bodies are counted before they are decoded (OTLP protobuf on the wire format; JSON bodies by the
  structures they open), so 20-30 MB of empty spans is a 413 in bounded memory;
- N17: a flood of health checks does not become a flood of store writes;
- and the info items: the fixed LLM URL asks for the token before it says anything, a span's time cannot be
  `false`, and a method a path does not take is a 405 naming the ones it does.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from agl.client import API, Client
from agl.common.processes import ServerProcess, start_server
from tests.conftest import wait_until
from tests.test_server_faults import HealthProbe, claim, health, peak_rss_mb, proxy_path


def connect(server: ServerProcess, *, rcvbuf: int | None = None) -> socket.socket:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect((host, int(port)))
    return sock


def answer_of(sock: socket.socket, timeout: float) -> bytes:
    sock.settimeout(timeout)
    try:
        return sock.recv(1000)
    except (TimeoutError, ConnectionResetError):
        return b""


@pytest.fixture
def quick_server(tmp_path: Path) -> Iterator[ServerProcess]:
    server = start_server(tmp_path / "run", extra_args=["--body-timeout=1", "--max-connections=60"])
    yield server
    server.stop()


# ---------------------------------------------------------------------- N12: the body


def test_a_body_that_never_arrives_is_answered_408(quick_server: ServerProcess) -> None:
    sized = connect(quick_server)
    sized.sendall(
        b"POST /api/v1/tasks HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
        b'content-length: 1000\r\n\r\n{"input": "'
    )
    chunked = connect(quick_server)
    chunked.sendall(
        b"POST /api/v1/tasks HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
        b'transfer-encoding: chunked\r\n\r\n5\r\n{"inp\r\n'
    )
    t0 = time.monotonic()
    for sock in (sized, chunked):
        answer = answer_of(sock, 10)
        assert answer.startswith(b"HTTP/1.1 408") and b"--body-timeout" in answer, answer
        sock.close()
    assert time.monotonic() - t0 < 6
    # a body that does arrive, slowly but within the time, is taken
    slow = connect(quick_server)
    body = json.dumps({"input": "slow"}).encode()
    slow.sendall(
        b"POST /api/v1/tasks HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
        + f"content-length: {len(body)}\r\n\r\n".encode()
        + body[:5]
    )
    time.sleep(0.5)
    slow.sendall(body[5:])
    assert answer_of(slow, 10).startswith(b"HTTP/1.1 201")
    slow.close()


def test_connections_trickling_their_bodies_are_shed_at_the_connection_cap(tmp_path: Path) -> None:
    server = start_server(tmp_path / "run", extra_args=["--max-connections=60", "--body-timeout=60"])
    trickling: list[socket.socket] = []
    try:
        for _ in range(150):  # 2.5 times the cap, each with its headers sent and one byte of a 100-byte body
            sock = connect(server)
            sock.sendall(
                b"POST /api/v1/tasks HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
                b"content-length: 100\r\n\r\n{"
            )
            trickling.append(sock)
        t0 = time.monotonic()
        assert health(server.url).status_code == 200 and time.monotonic() - t0 < 2
        shed = sum(answer_of(sock, 0.5).startswith(b"HTTP/1.1 408") for sock in trickling)
        assert shed >= 60, shed  # the oldest made room for the newer ones and for health
        assert "closing the ones that have been sending their headers or body longest" in server.log_path.read_text()
    finally:
        for sock in trickling:
            sock.close()
        server.stop()


# ---------------------------------------------------------------------- N13: trailers


def test_chunked_trailers_past_the_header_cap_are_431_in_bounded_memory(quick_server: ServerProcess) -> None:
    assert quick_server.proc is not None
    before = peak_rss_mb(quick_server.proc.pid)
    body = json.dumps({"input": "with trailers"}).encode()
    head = (
        b"POST /api/v1/tasks HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
        b"transfer-encoding: chunked\r\n\r\n" + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n"
    )
    # a small trailer is fine
    sock = connect(quick_server)
    sock.sendall(head + b"x-checksum: abc\r\n\r\n")
    assert answer_of(sock, 10).startswith(b"HTTP/1.1 201")
    sock.close()
    # a 16 MB trailer field is refused once it passes the header cap, long before it ends
    sock = connect(quick_server)
    sock.sendall(head + b"x-big: ")
    t0 = time.monotonic()
    try:
        for _ in range(256):
            sock.sendall(b"a" * 65536)
    except OSError:
        pass  # closed on us: the point
    answer = answer_of(sock, 10)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 431") and b"trailers" in answer, answer
    assert time.monotonic() - t0 < 5
    assert peak_rss_mb(quick_server.proc.pid) - before < 40


# ---------------------------------------------------------------------- N15: a reader that stops reading


def test_a_client_that_stops_reading_is_cut_and_its_call_stored_abandoned(tmp_path: Path, upstream: str) -> None:
    server = start_server(tmp_path / "run", upstream=upstream, extra_args=["--send-timeout=1"])
    try:
        c = claim(server)
        body = json.dumps(
            {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi " * 20_000}]}
        ).encode()
        sock = connect(server, rcvbuf=4096)  # small, so the server's sends back up
        sock.sendall(
            f"POST {proxy_path(c)}/chat/completions HTTP/1.1\r\nhost: localhost\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        # reads nothing and keeps its connection open: the server cuts it and stores the call
        with Client(server.url) as client:
            rid = c["rollout"]["id"]
            wait_until(lambda: bool(client.rollout_detail(rid).llm_calls), 30, "the call of the stalled reader")
            (call,) = client.rollout_detail(rid).llm_calls
            assert not call.trainable and call.http_status == 499, call
            assert client.proxy_usage()["in_flight"] == 0
        assert "read none of its answer for 1 s" in server.log_path.read_text()
        sock.close()
    finally:
        server.stop()


# ---------------------------------------------------------------------- N4: span bodies


def empty_protobuf_spans(n: int) -> bytes:
    """An ExportTraceServiceRequest of `n` empty spans, written on the wire directly (2 bytes each)."""

    def delimited(field: int, payload: bytes) -> bytes:
        size, out = len(payload), bytearray()
        while True:
            out.append((size & 0x7F) | (0x80 if size > 0x7F else 0))
            size >>= 7
            if not size:
                return bytes([(field << 3) | 2]) + bytes(out) + payload

    return delimited(1, delimited(2, b"\x12\x00" * n))


def test_span_bodies_full_of_empty_spans_are_refused_before_decoding(server: ServerProcess) -> None:
    assert server.proc is not None
    # built before the health probe starts: building them holds this process's GIL, and the probe's thread with it
    protobuf = empty_protobuf_spans(10_000_000)  # 20 MB
    empty = b",".join([b"{}"] * 10_000_000)
    otlp_json = b'{"resourceSpans":[{"scopeSpans":[{"spans":[' + empty + b"]}]}]}"
    rest = b'{"spans":[' + empty + b"]}"
    before = peak_rss_mb(server.proc.pid)
    with HealthProbe(server.url) as probe:
        resp = httpx.post(
            f"{server.url}/v1/traces", content=protobuf, headers={"content-type": "application/x-protobuf"}, timeout=60
        )
        assert resp.status_code == 413 and "more than 10000 spans" in resp.text, resp.text
        resp = httpx.post(f"{server.url}/v1/traces", content=otlp_json, headers={"content-type": "application/json"})
        assert resp.status_code == 413 and "JSON objects and lists" in resp.text, resp.text
        resp = httpx.post(f"{server.url}{API}/spans", content=rest, headers={"content-type": "application/json"})
        assert resp.status_code == 413 and "JSON objects and lists" in resp.text, resp.text
    assert probe.failures == 0 and probe.worst < 1.0
    assert peak_rss_mb(server.proc.pid) - before < 150


def test_a_span_time_cannot_be_a_boolean(server: ServerProcess) -> None:
    span = {"trace_id": "ab" * 16, "span_id": "cd" * 8, "name": "s", "start_time": 1.0, "end_time": False}
    resp = httpx.post(f"{server.url}{API}/spans", json={"spans": [span]})
    assert resp.status_code == 422 and "end_time" in resp.text and "boolean" in resp.text, resp.text


# ---------------------------------------------------------------------- N17: health


def test_a_flood_of_health_checks_is_not_a_flood_of_store_writes(server: ServerProcess) -> None:
    t0 = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        answers: list[dict[str, Any]] = list(pool.map(lambda _: health(server.url).json(), range(400)))
    took = time.monotonic() - t0
    assert all(a["status"] == "ok" for a in answers)
    probes = len({a["checked_at"] for a in answers})  # each write that went through, shared by every answer after it
    assert probes <= took + 2, (probes, took)
    # a probe stands for a second at most: a check after it writes again
    time.sleep(1.1)
    assert health(server.url).json()["checked_s_ago"] == 0.0


# ---------------------------------------------------------------------- info items


def test_the_fixed_llm_url_asks_for_the_token_before_anything_else(tmp_path: Path) -> None:
    server = start_server(tmp_path / "run", token="sekrit")
    try:
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        anonymous = httpx.post(f"{server.url}/v1/chat/completions", json=chat)
        assert anonymous.status_code == 401, anonymous.text
        signed = httpx.post(f"{server.url}/v1/chat/completions", json=chat, headers={"authorization": "Bearer sekrit"})
        assert signed.status_code == 409 and "outside any rollout" in signed.text
    finally:
        server.stop()


def test_a_method_a_path_does_not_take_is_405_naming_the_ones_it_does(server: ServerProcess) -> None:
    cases = {
        ("OPTIONS", f"{API}/rollouts/details"): "POST",  # also `/rollouts/{rollout_id}`, which takes GET
        ("DELETE", f"{API}/rollouts"): "GET, POST",
        ("POST", f"{API}/info"): "GET",  # no content type: still 405, not the content-type guard's 415
        ("PUT", "/v1/models"): "GET",
        ("PUT", "/v1/traces"): "POST",
        ("GET", "/rollout/r/attempt/a/v1/chat/completions"): "POST",
    }
    for (method, path), allow in cases.items():
        resp = httpx.request(method, f"{server.url}{path}")
        assert resp.status_code == 405 and resp.headers["allow"] == allow, (method, path, resp.status_code, resp.text)
        assert resp.json()["error"]["code"] == "method_not_allowed"
    # a documented POST still needs its content type
    assert httpx.post(f"{server.url}{API}/tasks", content=b'{"input": 1}').status_code == 415


def test_sampling_parameters_outside_openais_ranges_are_refused(server: ServerProcess) -> None:
    url = f"{server.url}/rollout/r/attempt/a/v1/chat/completions"  # checked before the attempt is looked up
    messages = [{"role": "user", "content": "hi"}]
    for key, value in (("temperature", 1e308), ("temperature", -1), ("top_p", 1.5), ("presence_penalty", 3)):
        resp = httpx.post(url, json={"model": "m", "messages": messages, key: value})
        assert resp.status_code == 400 and f"'{key}' must be between" in resp.text, (key, value, resp.text)
    resp = httpx.post(url, json={"model": "m", "messages": messages, "frequency_penalty": "high"})
    assert resp.status_code == 400 and "must be a number" in resp.text
