"""The sandbox's parts on their own (agl.capture.sandbox): the LLM relay's filter against a real HTTP server behind
a real Unix socket, reading an agent's files without following links, what a sandbox shows of the machine, the
refusal where bubblewrap cannot start (a clear error, never a bare run) and the opt-out's one warning, bad limits."""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import agl
from agl.capture.sandbox import mounts
from agl.capture.sandbox.llm_relay import LlmRelay


class Echo(BaseHTTPRequestHandler):
    """Answers with what reached it: the path, the authorization, the body."""

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        self._answer(f"{self.path}|{self.headers.get('authorization')}|{self.headers.get('host')}|{body.decode()}")

    def do_GET(self) -> None:
        self._answer(f"{self.path}|{self.headers.get('authorization')}|{self.headers.get('host')}|")

    def _answer(self, text: str) -> None:
        data = text.encode()
        self.send_response(200)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("sandbox.local", timeout=10)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.unix_path)


@pytest.fixture
def relay(tmp_path: Path) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    path = str(tmp_path / "llm.sock")
    url = f"http://127.0.0.1:{server.server_address[1]}"
    with LlmRelay(socket_path=path, server_url=url, attempt_path="/rollout/r1/attempt/a1", credential="agl-llm.a1.x"):
        yield path
    server.shutdown()


def ask(path: str, method: str, target: str, body: str | None = None, key: str = "stolen") -> tuple[int, str]:
    conn = UnixConnection(path)
    headers = {"authorization": f"Bearer {key}", "x-api-key": key}
    conn.request(method, target, body=body, headers=headers)
    answer = conn.getresponse()
    return answer.status, answer.read().decode()


def test_the_relay_passes_the_attempt_s_llm_routes_with_its_credential(relay: str) -> None:
    status, seen = ask(relay, "POST", "/rollout/r1/attempt/a1/v1/chat/completions", '{"messages": []}')
    path, authorization, host, body = seen.split("|", 3)
    assert status == 200 and path == "/rollout/r1/attempt/a1/v1/chat/completions" and body == '{"messages": []}'
    assert authorization == "Bearer agl-llm.a1.x"  # the agent's own key never goes on
    assert host.startswith("127.0.0.1:")
    named = "/rollout/r1/attempt/a1/agent/claude-code/v1/messages?beta=true"
    assert ask(relay, "POST", named, "{}")[0] == 200
    assert ask(relay, "GET", "/rollout/r1/attempt/a1/v1/models")[0] == 200


@pytest.mark.parametrize(
    "target",
    [
        "/api/v1/rewards",
        "/api/v1/attempts/a1/complete",
        "/api/v1/proxy/engines",
        "/ui/",
        "/v1/chat/completions",  # the fixed URL: its headers could name any attempt
        "/rollout/r1/attempt/a2/v1/chat/completions",  # another attempt
        "/rollout/r1/attempt/a1/v1/../../../../api/v1/rewards",
        "/rollout/r1/attempt/a1/v1/%2e%2e/%2e%2e/api/v1/rewards",
        "/rollout/r1/attempt/a1/v1%2f..%2f..%2fapi/v1/rewards",
        "/rollout/r1/attempt/a1/v1/",
        "http://127.0.0.1/api/v1/rewards",  # absolute form
        "/rollout/r1/attempt/a1x/v1/chat/completions",
    ],
)
def test_the_relay_refuses_everything_else(relay: str, target: str) -> None:
    status, said = ask(relay, "POST", target, "{}")
    assert status == 403 and "only this attempt's LLM routes" in said


def test_the_relay_sends_one_request_per_connection_and_nothing_behind_it(relay: str) -> None:
    """A second request smuggled after the first's body (pipelined) never reaches the server."""
    first = b"POST /rollout/r1/attempt/a1/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
    second = b"POST /api/v1/rewards HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(relay)
        sock.sendall(first + second)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.count(b"HTTP/1.") == 1 and b"/api/v1/rewards" not in answer
    both = (
        b"POST /rollout/r1/attempt/a1/v1/messages HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(relay)
        sock.sendall(both)
        assert sock.recv(100).startswith(b"HTTP/1.1 400")


def test_an_agent_s_file_is_read_without_following_a_link_out(tmp_path: Path) -> None:
    with agl.workspace() as ws:
        (ws / "answer.txt").write_text("mine")
        (tmp_path / "secret").write_text("not yours")
        os.symlink(tmp_path / "secret", ws / "link.txt")
        os.symlink(tmp_path, ws / "folder")
        os.mkfifo(ws / "pipe")
        assert agl.read_agent_file(ws / "answer.txt") == b"mine"
        for planted in ("link.txt", "folder/secret", "pipe"):
            with pytest.raises(ValueError):
                agl.read_agent_file(ws / planted)
        home = agl.agent_home(ws)
        (home / "trajectory.json").write_text("{}")
        assert agl.read_agent_file(home / "trajectory.json") == b"{}"
        assert home.parent == ws.parent and home != ws  # beside the workspace, not in it


def test_a_sandbox_shows_the_program_s_installation_and_only_world_readable_etc() -> None:
    venv = str(Path(sys.executable).parent.parent)
    shown = mounts.program_paths([sys.executable, "-c", "pass"], dict(os.environ))
    assert venv in shown or os.path.realpath(venv) in shown
    etc = Path(mounts.etc_folder())
    assert (etc / "ld.so.cache").exists() and not (etc / "shadow").exists() and not (etc / "ssl" / "private").exists()
    assert all(os.stat(p).st_mode & 0o004 for p in etc.rglob("*") if not p.is_symlink())


def test_without_bubblewrap_run_cli_refuses_and_says_how_to_install_it_or_opt_out(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    code = (
        "import agl, logging, sys\n"
        "logging.basicConfig()\n"
        "llm = agl.LLM(base_url='http://127.0.0.1:9/rollout/r/attempt/a/v1', model='m')\n"
        "try:\n"
        "    agl.run_cli(['/bin/true'], llm=llm, cwd=sys.argv[1])\n"
        "except agl.SandboxUnavailable as exc:\n"
        "    print('REFUSED', exc)\n"
        "for _ in range(2):\n"
        "    print('BARE', agl.run_cli(['/bin/true'], llm=llm, cwd=sys.argv[1], sandbox='none').returncode)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        env={**os.environ, "PATH": str(empty)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "REFUSED agl cannot start the sandbox: bubblewrap (bwrap) is not installed" in done.stdout, done.stderr
    assert "apt-get install bubblewrap" in done.stdout and "sandbox='none'" in done.stdout
    assert done.stdout.count("BARE 0") == 2
    assert done.stderr.count("runs without a sandbox") == 1  # the opt-out, said once


@pytest.mark.parametrize(("field", "value"), [("memory_mb", 0), ("processes", -1), ("disk_mb", 1.5), ("cpu_s", True)])
def test_a_bad_limit_is_refused_by_name(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"limit {field} must be a whole number"):
        agl.Limits(**{field: value})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="kind 'container' needs an image"):
        agl.Sandbox(kind="container")
    with pytest.raises(ValueError, match="a list of paths, not one path"):
        agl.Sandbox(read_only="/data")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="writable names paths that do not exist: /no/such/folder"):
        agl.run_sandboxed(["true"], cwd="/tmp", sandbox=agl.Sandbox(writable=["/no/such/folder"]))
