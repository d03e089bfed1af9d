"""Fixtures that start real processes: a scripted OpenAI-compatible upstream and `agl serve`."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agl.client import Client
from agl.processes import ServerProcess, start_server, start_worker
from agl.schema import Rollout
from agl.testing.upstream import start_upstream_process

REPO = Path(__file__).resolve().parents[1]
AGENTS = str(REPO / "tests" / "e2e_agents.py")


@pytest.fixture(scope="session")
def upstream() -> Iterator[str]:
    proc, url = start_upstream_process()
    yield url
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def server(tmp_path: Path, upstream: str) -> Iterator[ServerProcess]:
    srv = start_server(tmp_path / "run", upstream=upstream)
    yield srv
    srv.stop()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.url) as c:
        yield c


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start `agl worker` processes on the e2e agents; all are stopped at the end of the test."""
    started: list[subprocess.Popen[bytes]] = []

    def start(agent: str, server_url: str, **kwargs: object) -> subprocess.Popen[bytes]:
        proc = start_worker(f"{AGENTS}:{agent}", server_url, log_path=tmp_path / f"worker-{len(started)}.log", **kwargs)  # type: ignore[arg-type]
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.terminate()
    for proc in started:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def wait_all(client: Client, ids: list[str], timeout: float = 60.0) -> list[Rollout]:
    rollouts = client.wait(ids, timeout=timeout)
    return sorted(rollouts, key=lambda r: ids.index(r.id))


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def run_cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agl.cli.main", *args], capture_output=True, text=True, check=check, timeout=120
    )
