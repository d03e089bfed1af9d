"""Fixtures that start real processes: a scripted OpenAI-compatible upstream, `agl serve` and workers."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from agl.client import Client
from agl.common.processes import ServerProcess
from agl.testing.fixtures import StartWorker, wait_rollouts

REPO = Path(__file__).resolve().parents[1]
AGENTS = str(REPO / "tests" / "e2e_agents.py")

# The shared fixtures (agl_upstream, agl_server, ...) come from agl-core's pytest plugin (agl.testing.fixtures);
# its helper under the short name used here.
wait_all = wait_rollouts


@pytest.fixture(scope="session")
def upstream(agl_upstream: str) -> str:
    return agl_upstream


@pytest.fixture
def server(agl_server: ServerProcess) -> ServerProcess:
    return agl_server


@pytest.fixture
def client(agl_client: Client) -> Client:
    return agl_client


@pytest.fixture
def workers(agl_workers: StartWorker) -> StartWorker:
    """Start `agl worker` processes on the e2e agents (`tests/e2e_agents.py:NAME`); all stopped after the test."""

    def start(agent: str, server_url: str, **kwargs: object) -> subprocess.Popen[bytes]:
        return agl_workers(f"{AGENTS}:{agent}", server_url, **kwargs)

    return start


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
