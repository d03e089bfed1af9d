"""A run's rollouts on the server: enqueued (a training step's ahead of time, within `max_staleness`), waited for,
and read back as training sees them (final attempts, packed token ids, with AIR's rewards)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from agl.client import Client
from agl.common.trainable import TrainableRollout
from agl.learn.air import AirRule, air_rewards, with_rewards_added
from agl.schema import Rollout
from agl_trainer.config import TrainConfig
from agl_trainer.run.waiting import wait_for_rollouts
from agl_trainer.run.worker_pool import WorkerPool


def tasks_for_step(tasks: Sequence[Any], per_step: int, seed: int, step: int) -> list[Any]:
    """A fresh seeded permutation of the training tasks per epoch, `per_step` at a time."""
    out = []
    for index in range(step * per_step, step * per_step + per_step):
        epoch, offset = divmod(index, len(tasks))
        order = list(range(len(tasks)))
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
        out.append(tasks[order[offset]])
    return out


class RolloutQueue:
    def __init__(
        self,
        client: Client,
        config: TrainConfig,
        *,
        rules: Sequence[AirRule],
        workers: WorkerPool,
        logs: Path,
        console: Console,
    ) -> None:
        self.client = client
        self.config = config
        self.rules = rules
        self.workers = workers  # watched while waiting: a worker that died is named, with its log
        self.logs = logs
        self.console = console
        self.pending: dict[int, list[str]] = {}  # rollouts enqueued per training step, not yet trained on

    def enqueue(self, tasks: Sequence[Any], *, n: int, mode: str, step: int) -> list[str]:
        cfg = self.config
        return [
            r.id
            for task in tasks
            for r in self.client.enqueue(
                task, n=n, mode=mode, step=step, max_attempts=cfg.max_attempts, timeout_s=cfg.rollout_timeout_s
            )
        ]

    def enqueue_training(self, step: int, max_staleness: int) -> None:
        """Enqueue the training rollouts of `step` and of the `max_staleness` steps after it (within the run), those
        not enqueued yet: while version `step` serves, no later step may start than this bound allows."""
        cfg = self.config
        through = min(step + max_staleness, cfg.steps - 1)
        for ahead in range(max(step, max(self.pending, default=step - 1) + 1), through + 1):
            tasks = tasks_for_step(cfg.train_tasks, cfg.tasks_per_step, cfg.seed, ahead)
            self.pending[ahead] = self.enqueue(tasks, n=cfg.group_size, mode="train", step=ahead)

    def run(self, tasks: Sequence[Any], *, n: int, mode: str, step: int, label: str) -> list[Rollout]:
        return self.wait(self.enqueue(tasks, n=n, mode=mode, step=step), label)

    def wait(self, ids: Sequence[str], label: str) -> list[Rollout]:
        cfg = self.config
        return wait_for_rollouts(
            self.client,
            ids,
            label=label,
            console=self.console,
            stall_s=cfg.rollout_timeout_s * cfg.max_attempts + 120,
            workers=self.workers,
            logs=self.logs,
        )

    def trainable(self, rollouts: Sequence[Rollout]) -> list[TrainableRollout]:
        """The step's rollouts as training reads them (final attempts, packed token ids), with AIR's rewards."""
        found = self.client.trainable_rollouts([r.id for r in rollouts])
        if not self.rules:
            return found
        new = [air_rewards(d, self.rules) for d in found]  # the rules run once per rollout
        if any(new):
            self.client.add_rewards([r for rewards in new for r in rewards])  # stored (once, by uid) for `agl show`
        return [with_rewards_added(d, rewards) for d, rewards in zip(found, new, strict=True)]
