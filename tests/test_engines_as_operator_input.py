"""Engines are operator input (agl.server.engine_admission, agl.server.engines): through a real `agl serve`,

- changing engines needs a token even on a loopback server without `--token` (the admin token a trainer gives);
- an engine URL is `http(s)://host[:port]/path` and nothing else; link-local hosts and hosts off the list are
  refused; the server itself, or any agl server, is not an engine; a call that comes back is refused (508), once;
- the upstream's API key goes only to engines given on the command line;
- unreachable engines in a row give one 502 stored once (never a 500); an engine answering garbage leaves rotation.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from agl.client import Client
from agl.common.processes import ServerProcess, start_server
from agl.server.engines import EngineRouter, EngineUrlError, engine_url
from agl.testing.upstream import start_upstream_process

API = "/api/v1"
ADMIN = "an-admin-token-for-the-tests"


class Recorder(ThreadingHTTPServer):
    """An engine that answers every POST with 200 and a body that is not JSON, and keeps each request's headers."""

    seen: list[dict[str, str]]


class _Garbage(BaseHTTPRequestHandler):
    server: Recorder

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.server.seen.append({k.lower(): v for k, v in self.headers.items()})
        body = b"<html>not an answer</html>"
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.send_response(404)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def garbage() -> Iterator[tuple[Recorder, str]]:
    server = Recorder(("127.0.0.1", 0), _Garbage)
    server.seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


@pytest.fixture
def scripted() -> Iterator[str]:
    proc, url = start_upstream_process()
    yield url
    proc.terminate()
    proc.wait(10)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(tmp_path: Path, *args: str, admin: bool = True) -> ServerProcess:
    extra = list(args)
    if admin:
        tmp_path.mkdir(parents=True, exist_ok=True)
        (tmp_path / "admin").write_text(ADMIN)
        extra.append(f"--admin-token-file={tmp_path / 'admin'}")
    return start_server(tmp_path / "run", extra_args=extra)


def attempt(server: ServerProcess) -> tuple[str, str]:
    with Client(server.url) as client:
        (rollout,) = client.enqueue("x")
    (claim,) = httpx.post(f"{server.url}{API}/claims", json={"worker_id": "w", "lease_s": 600}).json()
    return rollout.id, f"{server.url}/rollout/{rollout.id}/attempt/{claim['attempt']['id']}/v1"


def chat(base: str) -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(f"{base}/chat/completions", json=body, timeout=60)


def add(server: ServerProcess, url: str, token: str | None = ADMIN) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.post(f"{server.url}{API}/proxy/engines", json={"url": url}, headers=headers, timeout=30)


def test_changing_engines_needs_a_token_on_loopback(tmp_path: Path, scripted: str) -> None:
    plain = serve(tmp_path / "plain", f"--upstream={scripted}", admin=False)
    try:
        answer = add(plain, "http://127.0.0.1:9/v1", token=None)
        assert answer.status_code == 403 and "--admin-token-file" in answer.text
        removed = httpx.post(f"{plain.url}{API}/proxy/engines/remove", json={"url": scripted})
        assert removed.status_code == 403
        assert [e["url"] for e in httpx.get(f"{plain.url}{API}/proxy/engines").json()] == [scripted]
    finally:
        plain.stop()
    server = serve(tmp_path / "admin", f"--upstream={scripted}")
    try:
        assert add(server, "http://127.0.0.1:9/v1", token="wrong").status_code == 403
        assert add(server, "http://127.0.0.1:9/v1").status_code == 201
        with Client(server.url, token=ADMIN) as client:
            assert [e["url"] for e in client.remove_engine("http://127.0.0.1:9/v1")] == [scripted]
    finally:
        server.stop()


BAD_URLS = [
    ("http://169.254.169.254/latest/meta-data", 403, "link-local"),
    ("http://user:pw@127.0.0.1:9/v1", 422, "user name or password"),
    ("http://127.0.0.1:9/v1\u0000x", 422, "control character"),
    ("http://127.0.0.1:9/v1/../../admin", 422, "'..'"),
    ("http://127.0.0.1:9/v1/%2e%2e/admin", 422, "'..'"),
    ("http://127.0.0.1:9/v1?x=1", 422, "query"),
    ("http://127.0.0.1:9/v1#x", 422, "fragment"),
    ("http://127.0.0.1:99999/v1", 422, "port"),
    ("ftp://127.0.0.1:9/v1", 422, "http"),
]


def test_engine_urls_are_checked(tmp_path: Path) -> None:
    server = serve(tmp_path)
    try:
        for url, status, why in BAD_URLS:
            answer = add(server, url)
            assert (answer.status_code, why in answer.text) == (status, True), (url, answer.text)
            if status == 422:
                with pytest.raises(EngineUrlError, match=why.replace("'", ".")):
                    engine_url(url)
        assert httpx.get(f"{server.url}{API}/proxy/engines").json() == []  # nothing was added
    finally:
        server.stop()
    # the command line's engines are checked as well, before the server starts
    argv = [sys.executable, "-m", "agl.cli.main", "serve", f"--run-dir={tmp_path / 'cli'}", "--port=0"]
    refused = subprocess.run(
        [*argv, "--upstream=http://u:p@127.0.0.1:9/v1"], capture_output=True, text=True, timeout=60
    )
    assert refused.returncode != 0 and "user name or password" in refused.stderr


def test_agl_itself_is_no_engine_and_a_loop_is_cut_at_once(tmp_path: Path) -> None:
    port = closed_port()
    # its only engine leads back to itself, as an operator's typo would: one call, refused where it comes back
    server = serve(tmp_path / "loop", f"--port={port}", f"--upstream=http://127.0.0.1:{port}/rollout/r/attempt/a/v1")
    other = serve(tmp_path / "other")
    try:
        assert add(server, f"{server.url}/v1").status_code == 422  # its own address
        assert "agl server" in add(server, f"{other.url}/rollout/r/attempt/a/v1").text  # agl's header
        rid, base = attempt(server)
        answer = chat(base)
        assert answer.status_code == 508, answer.text
        with Client(server.url) as client:
            (call,) = client.rollout_detail(rid).llm_calls  # one call stored, not 1,000
            assert call.http_status == 508 and not call.trainable
        hops = httpx.post(f"{base}/chat/completions", json={}, headers={"x-agl-via": "a,b,c,d"})
        assert hops.status_code == 508 and "loop" in hops.text
    finally:
        server.stop()
        other.stop()


def test_the_api_key_goes_only_to_engines_on_the_command_line(
    tmp_path: Path, scripted: str, garbage: tuple[Recorder, str]
) -> None:
    recorder, url = garbage
    server = serve(tmp_path, f"--upstream={scripted}", "--upstream-api-key=SECRET-KEY")
    try:
        assert add(server, url).status_code == 201
        with Client(server.url, token=ADMIN) as client:
            client.remove_engine(scripted)
        _, base = attempt(server)
        assert chat(base).status_code == 502  # its garbage: a 502, stored as an error
        assert recorder.seen and all("authorization" not in h for h in recorder.seen)
        assert all(h.get("x-agl-via") for h in recorder.seen)
    finally:
        server.stop()


def test_unreachable_engines_in_a_row_give_one_502_stored_once(tmp_path: Path) -> None:
    dead = [f"--upstream=http://127.0.0.1:{closed_port()}/v1" for _ in range(3)]
    server = serve(tmp_path, *dead)
    try:
        rid, base = attempt(server)
        answer = chat(base)
        assert answer.status_code == 502, answer.text
        with Client(server.url) as client:
            (call,) = client.rollout_detail(rid).llm_calls
            assert call.http_status == 502 and not call.trainable
            assert [e["failures"] for e in client.engines()] == [1, 1, 1]  # each tried once
    finally:
        server.stop()


def test_an_engine_answering_garbage_leaves_rotation(
    tmp_path: Path, scripted: str, garbage: tuple[Recorder, str]
) -> None:
    recorder, url = garbage
    server = serve(tmp_path, f"--upstream={scripted}", f"--upstream={url}")
    try:
        statuses = [chat(attempt(server)[1]).status_code for _ in range(12)]
        assert statuses.count(502) == 1 and statuses.count(200) == 11, statuses  # one call found it out
        assert len(recorder.seen) == 1
        with Client(server.url) as client:
            bad = next(e for e in client.engines() if e["url"] == url)
        assert bad["failures"] == 1 and not bad["in_rotation"] and "unusable" in bad["last_error"]
    finally:
        server.stop()


def test_an_attempt_returns_to_its_first_engine_once_it_is_back() -> None:
    router = EngineRouter(["http://a/v1", "http://b/v1"])
    a, b = router.engines["http://a/v1"], router.engines["http://b/v1"]
    first = router.pick("attempt")
    moved_to = b if first is a else a
    router.failed(first, "restarting")  # type: ignore[arg-type]
    assert router.pick("attempt") is moved_to and router.pick("attempt") is moved_to
    router.answered(first)  # type: ignore[arg-type] - back in rotation
    assert router.pick("attempt") is first
    # an engine removed for good: the attempt stays where it moved
    router.failed(first, "gone")  # type: ignore[arg-type]
    assert router.pick("attempt") is moved_to
    router.remove(first.url)  # type: ignore[union-attr]
    assert router.pick("attempt") is moved_to
    assert router.pick("other", avoid={moved_to.url}) is None  # nothing left but what the call tried
