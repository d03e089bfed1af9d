"""A run's wait for its rollouts gives up, naming the logs, once every local worker process has exited (a worker
that cannot import its agent, say), instead of waiting out the stall limit. A real `agl serve` and real processes;
the Ray workers' pool answers the same two questions (test_ray_workers.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from agl.client import Client
from agl.common.processes import ServerProcess
from agl_trainer.run.waiting import wait_for_rollouts
from agl_trainer.run.worker_pool import LocalWorkers


def test_the_wait_ends_when_every_local_worker_has_exited(agl_server: ServerProcess, tmp_path: Path) -> None:
    exits = [subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"]) for _ in range(2)]
    pool = LocalWorkers(exits)
    with Client(agl_server.url) as client:
        ids = [r.id for r in client.enqueue({"q": 1}, n=2)]
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match=f"every worker process exited; see {tmp_path}"):
            wait_for_rollouts(
                client, ids, label="train", console=Console(quiet=True), stall_s=300, workers=pool, logs=tmp_path
            )
    assert time.monotonic() - t0 < 60  # not the stall limit
    assert pool.all_gone()


def test_stop_ends_every_local_worker_that_still_runs() -> None:
    running = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) for _ in range(2)]
    pool = LocalWorkers(running)
    assert not pool.all_gone()
    pool.stop()
    assert pool.all_gone() and all(p.returncode is not None for p in running)
