"""The held-out evaluation: each eval task once, with the policy that serves now; its accuracy, rewards and a
sample of its rollouts go to the metrics (and the trackers' sample table)."""

from __future__ import annotations

import json
import time
from typing import Any

from rich.console import Console

from agl.schema import Rollout
from agl_trainer.config import TrainConfig
from agl_trainer.policy.memory import give_back
from agl_trainer.run.rollouts import RolloutQueue
from agl_trainer.run.step_metrics import mean, memory_fields
from agl_trainer.tracking.metrics import MetricsLog

SAMPLE_ROWS = 16  # rollouts per evaluation in the trackers' sample tables (all of them are in the store)


def evaluate(
    step: int,
    *,
    config: TrainConfig,
    rollouts: RolloutQueue,
    metrics: MetricsLog,
    console: Console,
    inference: Any,
    started_at: float,
) -> float:
    """The accuracy after `step` updates (`started_at`: the run's start, on the monotonic clock)."""
    cfg = config
    started = time.monotonic()
    done = rollouts.run(cfg.eval_tasks, n=1, mode="eval", step=step, label=f"eval @ {step}")
    eval_s = time.monotonic() - started
    give_back()
    finals = [r.final_reward for r in done]
    correct = sum(1 for v in finals if v is not None and v >= cfg.success_threshold)
    accuracy = correct / len(done)
    metrics.write(
        {
            "kind": "eval",
            "step": step,
            "accuracy": accuracy,
            "n": len(done),
            "reward_mean": mean([v for v in finals if v is not None]),
            "failed": sum(r.status.value == "failed" for r in done),
            "no_reward": sum(v is None for v in finals),
            "eval_s": eval_s,
            **memory_fields(inference),
            "elapsed_min": (time.monotonic() - started_at) / 60,
        }
    )
    metrics.samples(
        step, [_sample_row(t, r) for t, r in zip(cfg.eval_tasks[:SAMPLE_ROWS], done[:SAMPLE_ROWS], strict=True)]
    )
    console.print(f"[bold]eval after {step} steps: accuracy {accuracy:.3f} ({correct}/{len(done)})[/] in {eval_s:.0f}s")
    return accuracy


def _sample_row(task: Any, rollout: Rollout) -> dict[str, Any]:
    text = task if isinstance(task, str) else json.dumps(task, ensure_ascii=False, default=str)
    return {
        "rollout_id": rollout.id,
        "task": text[:300],
        "status": rollout.status.value,
        "reward": rollout.final_reward,
        "error": (rollout.error or "").split("\n", 1)[0][:200] or None,
    }
