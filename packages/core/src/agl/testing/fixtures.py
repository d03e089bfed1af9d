"""pytest fixtures that start real processes: a scripted OpenAI-compatible upstream, `agl serve`, `agl worker`.

A pytest plugin (entry point `pytest11: agl`, extra `agl-core[testing]`): any test suite in an environment with
agl-core gets `agl_upstream`, `agl_server`, `agl_client` and `agl_workers` without importing anything;
`wait_rollouts` and `run_one` are plain helpers to import.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agl.capture.runner import Runner
from agl.client import Client
from agl.common.processes import ServerProcess, start_server, start_worker, stop_processes
from agl.schema import Rollout, RolloutDetail
from agl.testing.upstream import start_upstream_process

__all__ = ["agl_client", "agl_server", "agl_upstream", "agl_workers", "run_one", "wait_rollouts", "worker_until_done"]

StartWorker = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture(scope="session")
def agl_upstream() -> Iterator[str]:
    """The base URL (ending in /v1) of a scripted upstream process shared by the session."""
    proc, url = start_upstream_process()
    yield url
    stop_processes([proc], grace_s=10)


@pytest.fixture
def agl_server(tmp_path: Path, agl_upstream: str) -> Iterator[ServerProcess]:
    """A fresh `agl serve` on its own run directory, forwarding LLM calls to the scripted upstream."""
    srv = start_server(tmp_path / "run", upstream=agl_upstream)
    yield srv
    srv.stop()


@pytest.fixture
def agl_client(agl_server: ServerProcess) -> Iterator[Client]:
    with Client(agl_server.url) as c:
        yield c


@pytest.fixture
def agl_workers(tmp_path: Path) -> Iterator[StartWorker]:
    """`start(agent_spec, server_url, **kwargs)` starts an `agl worker`; all are stopped after the test. Logs go
    to `tmp_path/worker-N.log` (read them when a rollout fails)."""
    started: list[subprocess.Popen[bytes]] = []

    def start(agent: str, server_url: str, **kwargs: object) -> subprocess.Popen[bytes]:
        log_path = tmp_path / f"worker-{len(started)}.log"
        proc = start_worker(agent, server_url, log_path=log_path, **kwargs)  # type: ignore[arg-type]
        started.append(proc)
        return proc

    yield start
    stop_processes(started, grace_s=10)


def worker_until_done(
    agent: str,
    server_url: str,
    ids: list[str],
    log_path: Path,
    *,
    env: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
) -> list[Rollout]:
    """`agl worker AGENT` as a user's shell starts it (none of this test's OPENAI_, AGL_ or LITELLM_ variables, then
    `env`), run until the rollouts `ids` have finished, then stopped: the rollouts. Its log is `log_path`."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AGL_", "LITELLM_"))}
    command = [sys.executable, "-m", "agl.cli.main", "worker", agent, f"--server={server_url}", *args]
    with log_path.open("ab") as log, Client(server_url) as client:
        proc = subprocess.Popen(command, stdout=log, stderr=log, env={**clean, **(env or {})})
        try:
            return wait_rollouts(client, ids, timeout=180)
        finally:
            proc.terminate()
            proc.wait(15)


def wait_rollouts(client: Client, ids: list[str], timeout: float = 180.0) -> list[Rollout]:
    """The rollouts once all are finished, in the order of `ids`. The deadline is generous: a worker's start
    (importing its framework) takes tens of seconds on a loaded 2-core machine."""
    rollouts = client.wait(ids, timeout=timeout)
    return sorted(rollouts, key=lambda r: ids.index(r.id))


def run_one(app: Any, server: ServerProcess, client: Client, task: Any) -> RolloutDetail:
    """Run one rollout of `app` (a rollout function) in an in-process agl runner against `server`: what the store
    holds about it, its LLM calls in `seq` order. Fails the test if the rollout did not succeed."""
    (rollout,) = client.enqueue(task)
    stats = Runner(app, server.url, concurrency=1, heartbeat_s=0.5).run(max_rollouts=1)
    detail = client.rollout_detail(rollout.id)
    assert stats.succeeded == 1, (stats, detail.rollout.error)
    detail.llm_calls.sort(key=lambda c: c.seq)
    return detail
