"""Waiting for a batch of rollouts with a progress bar: the training loop's steps and `agl bench eval`."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agl.client import Client
from agl.schema import Rollout
from agl_trainer.run.worker_pool import WorkerPool


def wait_for_rollouts(
    client: Client,
    ids: Sequence[str],
    *,
    label: str,
    console: Console,
    stall_s: float,
    workers: WorkerPool,
    logs: Path,
) -> list[Rollout]:
    """The rollouts once all have finished. A long batch is fine (each rollout has its own time limit, which the
    server enforces); the wait gives up when every worker has exited or nothing finished for `stall_s`."""
    columns = (TextColumn(f"{label:<14}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        bar = progress.add_task(label, total=len(ids))
        done, last_progress = 0, time.monotonic()
        while True:
            rollouts = client.get_rollouts(ids)
            finished = sum(r.status.terminal for r in rollouts)
            progress.update(bar, completed=finished)
            if finished == len(ids):
                return rollouts
            if finished > done:
                done, last_progress = finished, time.monotonic()
            if workers.all_gone():
                raise RuntimeError(f"every worker process exited; see {logs}")
            if time.monotonic() - last_progress > stall_s:
                raise RuntimeError(
                    f"no rollout finished for {stall_s:.0f} s ({len(ids) - finished} unfinished); the finished ones "
                    "are in the run's store"
                )
            time.sleep(0.25)
