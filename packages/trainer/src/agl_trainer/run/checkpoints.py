"""Checkpoints and resuming from them. A checkpoint is the policy's saved weights and the step they were saved
after, in `step-<n>/`; `latest` names the newest complete one (a crash mid-save leaves the previous one latest).
Resuming loads it into the trainer and the engine, cancels what the interrupted step left on the server, and
forgets the metrics written after it."""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from agl.client import Client
from agl_trainer.backends import InferenceBackend, PolicyBackend
from agl_trainer.engines.colocation import Colocation, publish_first_weights
from agl_trainer.tracking.metrics import MetricsLog


def save_checkpoint(root: Path, step: int, policy: PolicyBackend, sharing: Colocation | None) -> None:
    target = root / f"step-{step}"
    staging = root / f".step-{step}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    # verl gathers its shards to save them: on colocated GPUs, on the trainer's turn
    with sharing.trainer_turn() if sharing is not None else contextlib.nullcontext():
        policy.save(staging)
    (staging / "state.json").write_text(json.dumps({"step": step}))
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)  # a crash mid-save leaves the previous checkpoint as the latest
    (root / "latest").write_text(target.name)


def latest_checkpoint(root: Path) -> Path | None:
    latest = root / "latest"
    return root / latest.read_text().strip() if latest.exists() else None


def load_checkpoint(
    checkpoint: Path,
    *,
    policy: PolicyBackend,
    inference: InferenceBackend,
    sharing: Colocation | None,
    weights_lock: contextlib.AbstractContextManager[Any],
    sync_engine: Callable[[], None] | None,
) -> int:
    """Load `checkpoint`'s weights into the trainer and the engine: the step they were saved after."""
    with weights_lock:
        if sharing is not None:
            sharing.give_trainer_the_gpus()
        policy.load(checkpoint)
        if sync_engine is not None:
            sync_engine()
        publish_first_weights(cast(Any, inference), sharing)
    return int(json.loads((checkpoint / "state.json").read_text())["step"])


def cancel_unfinished(client: Client) -> None:
    """Cancel every rollout still queued or running: the interrupted run's, which no step will read."""
    for status in ("queued", "running"):
        stale, _ = client.list_rollouts(status=status, limit=10_000)
        for r in stale:
            client.cancel(r.id)


def forget_metrics_after(metrics: MetricsLog, step: int) -> None:
    """Keep the metrics of the steps before `step` and its evaluation: the resumed run writes the rest again."""
    kept = [r for r in metrics.rows() if r["step"] < step or (r["kind"] == "eval" and r["step"] == step)]
    metrics.path.write_text("".join(json.dumps(r) + "\n" for r in kept))
