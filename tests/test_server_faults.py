"""The server under the faults of issue #27, each against a real `agl serve` process.

1. A streamed call whose agent stops reading and hangs up: the store's writer survives it, the call is stored as
   abandoned (not trainable), and a writer that dies anyway makes the server unhealthy and exit loudly.
2. Request lines and headers are capped (431), in bounded memory.
3. Connections that never finish their headers are closed (408), and at the connection cap the stalled ones make
   room, so health keeps answering.
4. OTLP export requests are capped in spans (413, counted before any span is built) and decoded off the event
   loop.
5. Calls past the proxy's pool of upstream connections wait for one instead of failing with 502.
6. Spans name an attempt of the rollout they name, still running.
7. Automatic (AIR) rewards come from the trainer only, never from an attempt's credential.
8. A worker that hangs up during its claim's long poll is handed nothing.
9. Input that made the server answer 500 (numbers past 64 bits, other scripts' digits, JSON nested hundreds
   deep, a 1,000-deep chain of parent spans) is a 4xx or renders.
10. The dashboard sends security headers and answers HEAD; a rollout timeout must be at least 1 ms.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from agl.client import API, Client
from agl.common.processes import ServerProcess, read_ready_line, start_server
from agl.schema import RewardIn, SpanIn
from agl.testing.upstream import start_upstream_process
from tests.conftest import run_cli, wait_until


def claim(server: ServerProcess) -> dict[str, Any]:
    """Enqueue a rollout and claim it, leased for longer than any test here runs: a lease that ran out on a slow
    machine would requeue an earlier rollout, and the next claim would take that one instead of its own."""
    with Client(server.url) as client:
        client.enqueue("q")
    (found,) = httpx.post(f"{server.url}{API}/claims", json={"worker_id": "w", "lease_s": 600}).json()
    return dict(found)


def proxy_path(c: dict[str, Any]) -> str:
    return f"/rollout/{c['rollout']['id']}/attempt/{c['attempt']['id']}/v1"


def stalled_stream_then_hang_up(server: ServerProcess, c: dict[str, Any], words: int = 20_000) -> None:
    """Open a streamed chat completion whose answer (the scripted upstream echoes the prompt) is megabytes long,
    read none of it for a second, then close the connection: a slow consumer that gives up."""
    body = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi " * words}]}).encode()
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # small, so the server's sends back up
    sock.connect((host, int(port)))
    head = (
        f"POST {proxy_path(c)}/chat/completions HTTP/1.1\r\nhost: {host}:{port}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    time.sleep(1.0)
    sock.close()


def health(url: str, timeout: float = 10.0) -> httpx.Response:
    return httpx.get(f"{url}/healthz", timeout=timeout)


# ---------------------------------------------------------------------- 1. the writer and hung-up streams


def test_hung_up_streams_leave_the_writer_working_and_are_stored_abandoned(tmp_path: Path, upstream: str) -> None:
    server = start_server(tmp_path / "run", upstream=upstream)
    try:
        abandoned: list[dict[str, Any]] = []
        acknowledged: list[str] = []
        for _ in range(5):
            c = claim(server)
            abandoned.append(c)
            stalled_stream_then_hang_up(server, c)
            # every kind of write still goes through, promptly
            resp = httpx.post(f"{server.url}{API}/tasks", json={"input": "after"}, timeout=10)
            assert resp.status_code == 201, resp.text
            acknowledged.append(resp.json()["id"])
            assert health(server.url).status_code == 200
        with Client(server.url) as client:
            for c in abandoned:
                rid = c["rollout"]["id"]
                wait_until(lambda rid=rid: bool(client.rollout_detail(rid).llm_calls), 30, "the abandoned call")
                (call,) = client.rollout_detail(rid).llm_calls
                assert not call.trainable and call.status == "error" and call.http_status == 499
                assert "hung up" in (call.not_trainable_reason or "")
            # claims, the proxy, spans, rewards and completions all work afterwards
            c = claim(server)
            url = f"{server.url}{proxy_path(c)}/chat/completions"
            answer = httpx.post(url, json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}, timeout=10)
            assert answer.status_code == 200
            rid, aid = c["rollout"]["id"], c["attempt"]["id"]
            now = time.time()
            span = SpanIn(trace_id="ab" * 16, span_id="cd" * 8, name="s", start_time=now, end_time=now, rollout_id=rid)
            assert client.add_spans([span.model_copy(update={"attempt_id": aid})]) == 1
            assert client.add_rewards([RewardIn(rollout_id=rid, attempt_id=aid, value=0.5, name="mid")]) == 1
            done = httpx.post(f"{server.url}{API}/attempts/{aid}/complete", json={"status": "succeeded", "reward": 1})
            assert done.status_code == 200 and done.json()["status"] == "succeeded"
            (call,) = client.rollout_detail(c["rollout"]["id"]).llm_calls
            assert call.trainable
            for task_id in acknowledged:  # nothing acknowledged was lost
                assert httpx.get(f"{server.url}{API}/tasks/{task_id}").json()["input"] == "after"
    finally:
        server.stop()


def test_health_reports_a_writable_store(server: ServerProcess) -> None:
    resp = health(server.url)
    assert resp.status_code == 200 and resp.json()["store"] == "writable"
    assert httpx.head(f"{server.url}/healthz").status_code == 200
    assert httpx.get(f"{server.url}{API}/info").json()["store_writable"] is True


# A server whose writer thread dies after its first few batches (as a bug in it would make it): the death is
# simulated by a batch function that raises what the writer does not catch.
_DYING_SERVER = textwrap.dedent(
    """
    import sys
    import agl.store.writer as writer

    class Boom(BaseException):
        pass

    real = writer.run_batch
    batches = [0]
    limit = int(sys.argv[1])

    def run_batch(conn, batch):
        batches[0] += 1
        if batches[0] > limit:
            raise Boom("simulated death of the writer thread")
        real(conn, batch)

    writer.run_batch = run_batch
    from agl.cli.main import main
    sys.argv = ["agl", "serve", *sys.argv[2:]]
    main()
    """
)


def test_a_dead_writer_makes_the_server_unhealthy_and_exit_loudly(tmp_path: Path) -> None:
    args = [f"--run-dir={tmp_path / 'run'}", "--port=0", "--log-level=warning"]
    proc = subprocess.Popen(
        [sys.executable, "-c", _DYING_SERVER, "3", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        url = read_ready_line(proc, "AGL_SERVER_READY", 60)
        statuses = []
        t0 = time.monotonic()
        for _ in range(50):  # the writes past the third batch find the writer dead: 503 with the reason, no hang
            try:
                resp = httpx.post(f"{url}{API}/tasks", json={"input": "x"}, timeout=10)
            except httpx.TransportError:
                break  # the server has already gone
            statuses.append(resp.status_code)
            if resp.status_code == 503:
                assert "writer has stopped" in resp.json()["error"]["message"]
                try:  # unhealthy while it shuts down, if it still answers at all
                    assert health(url).status_code == 503
                except httpx.TransportError:
                    pass
                break
            time.sleep(0.1)
        assert 503 in statuses or proc.poll() is not None
        code = proc.wait(20)
        assert code != 0
        assert time.monotonic() - t0 < 20
        stderr = proc.stderr.read() if proc.stderr else ""
        assert "cannot write to its store any more" in stderr and "simulated death" in stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


# ---------------------------------------------------------------------- 2. header and URL size


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def send_huge_header(url: str, megabytes: int) -> bytes:
    """Send a request whose one header is `megabytes` long (or until the server closes); the server's answer."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"GET /api/v1/info HTTP/1.1\r\nhost: localhost\r\nx-big: ")
        try:
            for _ in range(megabytes):
                sock.sendall(b"a" * (1 << 20))
        except OSError:
            pass  # closed on us: the point
        try:
            return sock.recv(200)
        except OSError:
            return b""


def test_oversized_headers_and_urls_are_refused_with_431_in_bounded_memory(server: ServerProcess) -> None:
    assert server.proc is not None
    before = peak_rss_mb(server.proc.pid)
    t0 = time.monotonic()
    answer = send_huge_header(server.url, 256)
    assert answer.startswith(b"HTTP/1.1 431"), answer
    assert time.monotonic() - t0 < 10
    with ThreadPoolExecutor(4) as pool:  # four at once, 48 MB each: all refused
        answers = list(pool.map(lambda _: send_huge_header(server.url, 48), range(4)))
    assert all(a.startswith(b"HTTP/1.1 431") for a in answers), answers
    assert peak_rss_mb(server.proc.pid) - before < 50
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:  # httpx itself refuses such a URL
        sock.sendall(f"GET {API}/info?pad={'x' * 100_000} HTTP/1.1\r\nhost: localhost\r\n\r\n".encode())
        long_url = sock.recv(1000)
    assert long_url.startswith(b"HTTP/1.1 431") and b"--max-header-kb" in long_url
    # under the cap, headers and a body larger than the cap pass: only the head counts
    ok = httpx.post(
        f"{server.url}{API}/tasks", json={"input": "y" * 200_000}, headers={"x-pad": "p" * 50_000}, timeout=10
    )
    assert ok.status_code == 201
    assert "over 65536 bytes" in server.log_path.read_text()


# ---------------------------------------------------------------------- 3. slowloris


def test_stalled_connections_are_closed_and_health_answers_at_the_connection_cap(tmp_path: Path) -> None:
    server = start_server(tmp_path / "run", extra_args=["--max-connections=100", "--header-timeout=2"])
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    stalled: list[socket.socket] = []
    try:
        for _ in range(300):  # three times the cap, each stopping in the middle of its headers
            sock = socket.create_connection((host, int(port)))
            sock.sendall(b"GET /api/v1/info HTTP/1.1\r\nhost: loc")
            stalled.append(sock)
        t0 = time.monotonic()
        resp = health(server.url)
        assert resp.status_code == 200 and time.monotonic() - t0 < 2
        time.sleep(2.5)  # past the header timeout, every one of them has been answered and closed
        for sock in stalled:
            sock.settimeout(2)
            answer = sock.recv(200)
            assert answer == b"" or answer.startswith((b"HTTP/1.1 408", b"HTTP/1.1 503")), answer
        assert httpx.get(f"{server.url}{API}/info").status_code == 200
        logged = server.log_path.read_text()
        assert "did not arrive within 2 s" in logged or "closing the ones that have been" in logged
    finally:
        for sock in stalled:
            sock.close()
        server.stop()


# ---------------------------------------------------------------------- 4. OTLP amplification


def otlp_protobuf(n: int) -> bytes:
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


class HealthProbe:
    """Polls /healthz from a thread while something else runs; the slowest answer seen."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.worst = 0.0
        self.failures = 0
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop:
            t0 = time.monotonic()
            try:
                ok = health(self.url).status_code == 200
            except httpx.TransportError:
                ok = False
            self.worst = max(self.worst, time.monotonic() - t0)
            self.failures += not ok
            time.sleep(0.02)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        self._thread.join(30)


def test_otlp_requests_past_the_span_cap_are_refused_before_decoding(server: ServerProcess) -> None:
    assert server.proc is not None
    before = peak_rss_mb(server.proc.pid)
    body = otlp_protobuf(100_000)  # ~5 MB, as in the report
    with HealthProbe(server.url) as probe:
        resp = httpx.post(
            f"{server.url}/v1/traces", content=body, headers={"content-type": "application/x-protobuf"}, timeout=60
        )
    assert resp.status_code == 413, resp.text
    # counted on the wire and only as far as the limit: the 100,000 are never walked, let alone decoded
    assert "more than 10000 spans" in resp.text and "--max-spans-per-request" in resp.text
    assert probe.failures == 0 and probe.worst < 1.0
    spans = [
        {
            "traceId": f"{i + 1:032x}",
            "spanId": f"{i + 1:016x}",
            "name": "s",
            "startTimeUnixNano": "1700000000000000000",
            "endTimeUnixNano": "1700000000000001000",
        }
        for i in range(20_001)
    ]
    doc = {"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}
    resp = httpx.post(f"{server.url}/v1/traces", json=doc, timeout=60)
    assert resp.status_code == 413 and "20001 spans" in resp.text
    assert peak_rss_mb(server.proc.pid) - before < 150
    # at the cap it is accepted, and stored
    ok = httpx.post(
        f"{server.url}/v1/traces",
        content=otlp_protobuf(10_000),
        headers={"content-type": "application/x-protobuf"},
        timeout=60,
    )
    assert ok.status_code == 200
    assert httpx.get(f"{server.url}{API}/stats").json()["counts"]["spans"] == 10_000


# ---------------------------------------------------------------------- 5. the proxy under load


def proxied_burst(server: ServerProcess, calls: int, attempts: int) -> tuple[Counter[int], list[dict[str, Any]]]:
    """`calls` chat completions at once, spread over `attempts` claimed attempts: (status counts, the claims)."""
    import aiohttp

    with Client(server.url) as client:
        client.enqueue("q", n=attempts)
    claims = httpx.post(
        f"{server.url}{API}/claims", json={"worker_id": "w", "max_rollouts": attempts, "lease_s": 600}
    ).json()
    assert len(claims) == attempts
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

    async def burst() -> Counter[int]:
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

            async def one(i: int) -> int:
                url = f"{server.url}{proxy_path(claims[i % attempts])}/chat/completions"
                async with session.post(url, json=body) as resp:
                    await resp.read()
                    return resp.status

            return Counter(await asyncio.gather(*(one(i) for i in range(calls))))

    return asyncio.run(burst()), claims


def stored_calls(server: ServerProcess, claims: list[dict[str, Any]]) -> list[tuple[str, int]]:
    with Client(server.url) as client:
        details = client.rollout_details([c["rollout"]["id"] for c in claims])
    return [(call.attempt_id, call.seq) for d in details for call in d.llm_calls if call.status == "ok"]


@pytest.mark.slow
def test_two_thousand_concurrent_calls_on_a_slow_upstream_all_succeed_and_are_stored_once(tmp_path: Path) -> None:
    proc, slow = start_upstream_process(delay_s=2.0)
    server = start_server(tmp_path / "run", upstream=slow)
    try:
        assert server.proc is not None
        t0 = time.monotonic()
        statuses, claims = proxied_burst(server, 2000, 100)
        elapsed = time.monotonic() - t0
        print(
            f"2000 calls on a 2 s upstream: {dict(statuses)} in {elapsed:.1f} s; server peak RSS "
            f"{peak_rss_mb(server.proc.pid):.0f} MB"
        )
        assert statuses == Counter({200: 2000})
        stored = stored_calls(server, claims)
        assert len(stored) == 2000 and len(set(stored)) == 2000  # each answered call stored once
        assert elapsed < 60
    finally:
        server.stop()
        proc.terminate()
        proc.wait(10)


def test_calls_past_the_upstream_pool_wait_for_a_connection_instead_of_failing(tmp_path: Path) -> None:
    # 400 calls through 40 upstream connections to a 1.5 s upstream: the last wait ~14 s for a connection,
    # past the 10 s that used to fail them with 502
    proc, slow = start_upstream_process(delay_s=1.5)
    server = start_server(tmp_path / "run", upstream=slow, extra_args=["--upstream-connections=40"])
    try:
        statuses, claims = proxied_burst(server, 400, 20)
        assert statuses == Counter({200: 400})
        assert len(set(stored_calls(server, claims))) == 400
    finally:
        server.stop()
        proc.terminate()
        proc.wait(10)


# ---------------------------------------------------------------------- 6. and 7. what a credential may report


def claim_with_token(server: ServerProcess, token: str) -> dict[str, Any]:
    with Client(server.url, token=token) as client:
        client.enqueue("q")
    auth = {"authorization": f"Bearer {token}"}
    (found,) = httpx.post(f"{server.url}{API}/claims", json={"worker_id": "w"}, headers=auth).json()
    return dict(found)


def span_json(rollout_id: str | None, attempt_id: str | None, n: int) -> dict[str, Any]:
    now = time.time()
    return {
        "trace_id": f"{n:032x}",
        "span_id": f"{n:016x}",
        "name": "tool",
        "start_time": now,
        "end_time": now,
        "rollout_id": rollout_id,
        "attempt_id": attempt_id,
    }


def otlp_span(rollout_id: str, attempt_id: str, n: int) -> dict[str, Any]:
    attrs = [
        {"key": "agl.rollout_id", "value": {"stringValue": rollout_id}},
        {"key": "agl.attempt_id", "value": {"stringValue": attempt_id}},
    ]
    span = {
        "traceId": f"{n:032x}",
        "spanId": f"{n:016x}",
        "name": "s",
        "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000000000001000",
        "attributes": attrs,
    }
    return {"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}


def test_spans_must_name_a_running_attempt_of_their_own_rollout(tmp_path: Path, upstream: str) -> None:
    server = start_server(tmp_path / "run", upstream=upstream, token="operator")
    try:
        mine, other = claim_with_token(server, "operator"), claim_with_token(server, "operator")
        rid, aid = mine["rollout"]["id"], mine["attempt"]["id"]
        auth = {"authorization": f"Bearer {mine['credential']}"}
        admin = {"authorization": "Bearer operator"}
        spans = f"{server.url}{API}/spans"
        # A's credential, rollout B, attempt A: refused, and nothing shows in B
        crossed = httpx.post(spans, json={"spans": [span_json(other["rollout"]["id"], aid, 1)]}, headers=auth)
        assert crossed.status_code == 404 and "does not exist" in crossed.text
        # (an attempt's credential cannot post OTLP at all; the operator's names must agree too)
        crossed_otlp = httpx.post(
            f"{server.url}/v1/traces", json=otlp_span(other["rollout"]["id"], aid, 2), headers=admin
        )
        assert crossed_otlp.status_code == 404
        detail = httpx.get(f"{server.url}{API}/rollouts/{other['rollout']['id']}/detail", headers=admin).json()
        assert detail["spans"] == []
        # its own: stored
        assert httpx.post(spans, json={"spans": [span_json(rid, aid, 3)]}, headers=auth).json()["stored"] == 1
        # an unknown attempt, even with the operator's token
        ghost = httpx.post(spans, json={"spans": [span_json(rid, "at-ghost", 4)]}, headers=admin)
        assert ghost.status_code == 404
        done = httpx.post(f"{server.url}{API}/attempts/{aid}/complete", json={"status": "succeeded"}, headers=auth)
        assert done.status_code == 200
        # after the attempt ended: refused ...
        late = httpx.post(spans, json={"spans": [span_json(rid, aid, 5)]}, headers=admin)
        assert late.status_code == 409 and "can no longer report spans" in late.text
        late_otlp = httpx.post(f"{server.url}/v1/traces", json=otlp_span(rid, aid, 6), headers=admin)
        assert late_otlp.status_code == 409
        # ... except a batch sent again whose spans are stored already (its first answer was lost)
        again = httpx.post(spans, json={"spans": [span_json(rid, aid, 3)]}, headers=admin)
        assert again.status_code == 200 and again.json()["stored"] == 0
        detail = httpx.get(f"{server.url}{API}/rollouts/{rid}/detail", headers=admin).json()
        assert [s["span_id"] for s in detail["spans"]] == [f"{3:016x}"]
    finally:
        server.stop()


def test_an_attempt_credential_cannot_write_automatic_rewards(tmp_path: Path, upstream: str) -> None:
    server = start_server(tmp_path / "run", upstream=upstream, token="operator")
    try:
        c = claim_with_token(server, "operator")
        rid, aid = c["rollout"]["id"], c["attempt"]["id"]
        auth = {"authorization": f"Bearer {c['credential']}"}
        rewards = f"{server.url}{API}/rewards"
        forged = {"rollout_id": rid, "attempt_id": aid, "value": 99.0, "source": "automatic", "name": "air"}
        resp = httpx.post(rewards, json=[forged], headers=auth)
        assert resp.status_code == 403 and "trainer only" in resp.text
        done = httpx.post(f"{server.url}{API}/attempts/{aid}/complete", json={"status": "succeeded"}, headers=auth)
        assert done.status_code == 200
        assert httpx.post(rewards, json=[forged], headers=auth).status_code == 403  # after the end, too
        with Client(server.url, token="operator") as client:
            (trainable,) = client.trainable_rollouts([rid])
            assert all(r.value != 99.0 for r in trainable.rewards)
            # the trainer's own token writes them, after the attempt ended (AIR runs then)
            air = {**forged, "value": 0.2}
            assert httpx.post(rewards, json=[air], headers={"authorization": "Bearer operator"}).status_code == 200
            (trainable,) = client.trainable_rollouts([rid])
            assert [r.value for r in trainable.rewards if r.source == "automatic"] == [0.2]
    finally:
        server.stop()


# ---------------------------------------------------------------------- 8. a dead worker's claim


def test_a_claim_whose_worker_hung_up_takes_no_work(server: ServerProcess) -> None:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    body = json.dumps({"worker_id": "dead", "wait_s": 30}).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        f"POST {API}/claims HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n".encode()
        + body
    )
    time.sleep(0.5)  # its long poll is waiting
    sock.close()  # the worker is killed
    time.sleep(0.5)
    with Client(server.url) as client:
        (rollout,) = client.enqueue("q")
        claims = httpx.post(f"{server.url}{API}/claims", json={"worker_id": "alive", "wait_s": 5}).json()
        assert [c["rollout"]["id"] for c in claims] == [rollout.id]  # the live worker gets it
        assert claims[0]["attempt"]["number"] == 1  # no attempt burned by the dead one
        assert client.get_rollout(rollout.id).attempt_count == 1


# ---------------------------------------------------------------------- 9. answers that were 500


def nested(depth: int) -> str:
    """JSON text of a string inside `depth` lists (written by hand: the json module recurses, and stops at ~1,000)."""
    return "[" * depth + '"x"' + "]" * depth


def post_json_text(url: str, text: str) -> httpx.Response:
    return httpx.post(url, content=text.encode(), headers={"content-type": "application/json"})


def test_out_of_range_numbers_deep_json_and_deep_span_chains_are_4xx_or_render(server: ServerProcess) -> None:
    for query in (
        "step=99999999999999999999",
        "step=%EF%BC%91%EF%BC%92",  # full-width "１２"
        "min_reward=nan",
        "after=1.5:99999999999999999999",
        "after=%EF%BC%91:1",
    ):
        for path in ("/ui/api/rollouts", "/ui/rollouts"):
            resp = httpx.get(f"{server.url}{path}?{query}")
            assert resp.status_code == 400, (path, query, resp.status_code)
    assert httpx.get(f"{server.url}/ui/api/rollouts?step=12").status_code == 200

    c = claim(server)
    base = f"{server.url}{proxy_path(c)}"
    for depth in (256, 700, 1000):
        deep = '{"model": "m", "messages": [{"role": "user", "content": "hi", "x": ' + nested(depth) + "}]}"
        resp = post_json_text(f"{base}/chat/completions", deep)
        assert resp.status_code == 400 and "levels deep" in resp.text, resp.text[:300]
        deep = '{"model": "m", "input": "hi", "metadata": {"x": ' + nested(depth) + "}}"
        resp = post_json_text(f"{base}/responses", deep)
        assert resp.status_code == 400 and "levels deep" in resp.text, resp.text[:300]
    ok = httpx.post(f"{base}/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert ok.status_code == 200 and ok.headers["x-agl-llm-seq"] == "0"  # no sequence number was used up
    with Client(server.url) as client:
        assert len(client.rollout_detail(c["rollout"]["id"]).llm_calls) == 1

    # a chain of 1,000 spans, each the parent of the next
    rid, aid = c["rollout"]["id"], c["attempt"]["id"]
    chain = [span_json(rid, aid, i + 1) for i in range(1000)]
    for i in range(1, 1000):
        chain[i]["parent_id"] = chain[i - 1]["span_id"]
        chain[i]["trace_id"] = chain[0]["trace_id"]
    assert httpx.post(f"{server.url}{API}/spans", json={"spans": chain}).json()["stored"] == 1000
    page = httpx.get(f"{server.url}/ui/rollouts/{rid}")
    assert page.status_code == 200 and page.text.count("<li>") >= 1000
    shown = run_cli("show", rid, f"--server={server.url}", check=False)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "spans 1000" in shown.stdout


# ---------------------------------------------------------------------- 10. headers and small values


def test_the_dashboard_sends_security_headers_and_answers_head(server: ServerProcess) -> None:
    for path in ("/ui", "/ui/rollouts", "/ui/api/overview", "/ui/rollouts/ro-missing"):
        resp = httpx.get(f"{server.url}{path}")
        csp = resp.headers.get("content-security-policy", "")
        assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp, path
        assert resp.headers["x-frame-options"] == "DENY" and resp.headers["x-content-type-options"] == "nosniff"
    head = httpx.head(f"{server.url}/ui")
    assert head.status_code == 200 and head.content == b""
    assert httpx.head(f"{server.url}/ui/static/app.js").status_code == 200


def test_a_rollout_timeout_below_a_millisecond_is_refused(server: ServerProcess) -> None:
    resp = httpx.post(f"{server.url}{API}/rollouts", json={"task": {"input": "q"}, "timeout_s": 1e-300})
    assert resp.status_code == 422 and "timeout_s" in resp.text
    ok = httpx.post(f"{server.url}{API}/rollouts", json={"task": {"input": "q"}, "timeout_s": 0.5})
    assert ok.status_code == 201
