"""`agl.run_cli` watches what a command-line agent's process tree connects to besides agl (agl.capture.egress): a
real child process whose HTTP clients follow the proxy variables, a real HTTP server. In a sandbox (the default) the
proxy is the only way out: refused with a 403 by default, recorded and forwarded or allowed on request. Bare
(`sandbox="none"`): recorded and forwarded by default, agl's own address and loopback left out through NO_PROXY.
And the text it gives the command on standard input arrives as it is."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import agl
from agl.capture.cli_agent import run_cli

# The child: one plain-HTTP request through the proxy the environment names (with NO_PROXY dropped, so that a
# loopback test server stands in for a host elsewhere), then a CONNECT
# for HTTPS to a host that does not exist, the way a TLS client asks its proxy first.
CHILD = r"""
import os, sys, urllib.request, urllib.error, http.client
proxy = os.environ["HTTP_PROXY"]
print("no_proxy:", os.environ.pop("NO_PROXY"), os.environ.pop("no_proxy") != "")
opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy}))
try:
    print("plain:", opener.open(sys.argv[1], timeout=10).read().decode())
except urllib.error.HTTPError as exc:
    print("plain refused:", exc.code)
host, port = proxy.rsplit(":", 1)
conn = http.client.HTTPConnection(host.removeprefix("http://"), int(port), timeout=10)
conn.set_tunnel("api.example.invalid", 443)
try:
    conn.connect()
    print("tunnel: open")
except OSError as exc:
    print("tunnel:", exc)
"""


class Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"hello from {self.path}".encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def elsewhere() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/page?q=1"
    server.shutdown()


LLM = agl.LLM(base_url="http://agl-server.test:8765/rollout/r/attempt/a/v1", model="m")


def test_bare_connections_elsewhere_are_counted_and_forwarded(tmp_path: Path, elsewhere: str) -> None:
    done = run_cli([sys.executable, "-c", CHILD, elsewhere], llm=LLM, cwd=tmp_path, timeout_s=60, sandbox="none")
    assert done.returncode == 0, done.output_tail
    assert "plain: hello from /page?q=1" in done.output_tail  # forwarded, in origin form
    assert "no_proxy: localhost,127.0.0.1,::1,agl-server.test True" in done.output_tail
    port = elsewhere.split(":")[2].split("/")[0]
    # the tunnel's host does not resolve: it is counted all the same (the agent tried), then answered 502
    assert done.egress == {f"127.0.0.1:{port}": 1, "api.example.invalid:443": 1}


def test_sandboxed_connections_elsewhere_are_refused_and_counted_by_default(tmp_path: Path, elsewhere: str) -> None:
    done = run_cli([sys.executable, "-c", CHILD, elsewhere], llm=LLM, cwd=tmp_path, timeout_s=60)
    assert done.sandbox == "bwrap" and done.returncode == 0, done.output_tail
    assert "plain refused: 403" in done.output_tail and "403" in done.output_tail.split("tunnel:")[1]
    port = elsewhere.split(":")[2].split("/")[0]
    assert done.egress == {f"127.0.0.1:{port}": 1, "api.example.invalid:443": 1}


def test_sandboxed_record_forwards_through_the_proxy_and_allow_does_not_count(tmp_path: Path, elsewhere: str) -> None:
    """The sandbox's network has no route out: the egress proxy, on a Unix socket, is its way to other hosts."""
    recorded = run_cli([sys.executable, "-c", CHILD, elsewhere], llm=LLM, cwd=tmp_path, timeout_s=60, egress="record")
    assert "plain: hello from /page?q=1" in recorded.output_tail, recorded.output_tail
    assert sum(recorded.egress.values()) == 2
    allowed = run_cli([sys.executable, "-c", CHILD, elsewhere], llm=LLM, cwd=tmp_path, timeout_s=60, egress="allow")
    assert "plain: hello from /page?q=1" in allowed.output_tail and allowed.egress == {}


def test_bare_refuse_answers_403_and_counts(tmp_path: Path, elsewhere: str) -> None:
    done = run_cli(
        [sys.executable, "-c", CHILD, elsewhere], llm=LLM, cwd=tmp_path, timeout_s=60, egress="refuse", sandbox="none"
    )
    assert "plain refused: 403" in done.output_tail and "403" in done.output_tail.split("tunnel:")[1]
    assert sum(done.egress.values()) == 2


def test_bare_allow_and_a_proxy_of_the_workers_own_leave_the_environment_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    show = [sys.executable, "-c", "import os; print('proxy:', os.environ.get('HTTPS_PROXY'))"]
    assert "proxy: None" in run_cli(show, llm=LLM, cwd=tmp_path, egress="allow", sandbox="none").output_tail
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.company.test:3128")
    done = run_cli(show, llm=LLM, cwd=tmp_path, sandbox="none")
    assert "proxy: http://proxy.company.test:3128" in done.output_tail and done.egress == {}


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
def test_stdin_reaches_the_command_as_it_is_and_without_it_the_command_reads_nothing(
    tmp_path: Path, sandbox: str
) -> None:
    echo = [sys.executable, "-c", "import sys; print(repr(sys.stdin.read()))"]
    prompt = 'Fix "calc.py"; then run\nthe tests.'
    assert repr(prompt) in run_cli(echo, llm=LLM, cwd=tmp_path, stdin=prompt, sandbox=sandbox).output_tail
    assert "''" in run_cli(echo, llm=LLM, cwd=tmp_path, sandbox=sandbox).output_tail
