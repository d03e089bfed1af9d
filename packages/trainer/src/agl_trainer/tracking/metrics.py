"""What a training run writes for people: metrics as JSONL (one row per train step and per evaluation) and the
learning curve as a PNG, redrawn after every step — and the same to any experiment trackers attached
(agl_trainer.tracking.trackers)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agl_trainer.tracking.trackers import Tracker


class MetricsLog:
    def __init__(self, run_dir: Path, trackers: Sequence[Tracker] = ()) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.plot_path = run_dir / "learning_curve.png"
        self.trackers = list(trackers)

    def rows(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            if line.strip():
                out.append(json.loads(line))
        return out

    def write(self, row: dict[str, Any]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        with self.path.open("a") as f:
            f.write(json.dumps(clean) + "\n")
        for tracker in self.trackers:
            tracker.log_row(clean)

    def samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        """A table of sample rollouts of the evaluation at `step`, for the trackers (the store has them all)."""
        for tracker in self.trackers:
            tracker.log_samples(step, rows)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()
        self.trackers = []

    def plot(self, title: str = "agl train") -> Path:
        import matplotlib

        matplotlib.use("Agg")  # no display needed
        import matplotlib.pyplot as plt

        rows = self.rows()
        train = [r for r in rows if r.get("kind") == "train"]
        evals = [r for r in rows if r.get("kind") == "eval"]
        fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
        if train:
            ax.plot(
                [r["step"] for r in train], [r["reward_mean"] for r in train], marker=".", label="train reward (mean)"
            )
            ax.plot(
                [r["step"] for r in train], [r["success_rate"] for r in train], alpha=0.5, label="train success rate"
            )
        if evals:
            ax.plot(
                [r["step"] for r in evals],
                [r["accuracy"] for r in evals],
                marker="o",
                linewidth=2,
                label="held-out accuracy",
            )
        ax.set_xlabel("training step (policy updates before the measurement)")
        ax.set_ylabel("reward / accuracy")
        values = [r["reward_mean"] for r in train if r.get("reward_mean") is not None] + [1.0]
        ax.set_ylim(min(-0.05, min(values) - 0.05), max(values) + 0.05)  # shaped rewards may pass 1
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
        ax.set_title(title)
        fig.tight_layout()
        fig.savefig(self.plot_path)
        plt.close(fig)
        last = max((int(r["step"]) for r in rows), default=0)
        for tracker in self.trackers:
            tracker.log_curve(self.plot_path, last)
        return self.plot_path
