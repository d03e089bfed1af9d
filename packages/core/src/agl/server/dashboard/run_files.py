"""What the trainer writes into the run directory beside the store, read for the dashboard: the metrics rows
(`metrics.jsonl`, one per training step and evaluation) and what credit assignment gave each trained call
(`transitions/step-N.jsonl`). A run served without a trainer (`agl serve` alone) has neither: empty answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _jsonl(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    try:
        text = path.read_text()
    except (FileNotFoundError, NotADirectoryError):
        return rows
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written while we read: it is there next time
        if isinstance(row, dict):
            rows.append(row)
    return rows


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    return _jsonl(run_dir / "metrics.jsonl")


def curve(run_dir: Path) -> dict[str, list[list[float]]]:
    """The learning curve's series as [step, value] points: train reward, train success rate, held-out accuracy."""
    return curve_of(metrics(run_dir))


def curve_of(rows: list[dict[str, Any]]) -> dict[str, list[list[float]]]:
    series: dict[str, list[list[float]]] = {"train_reward": [], "train_success": [], "eval_accuracy": []}
    for row in rows:
        step = row.get("step")
        if not isinstance(step, (int, float)):
            continue
        if row.get("kind") == "train":
            for key, name in (("reward_mean", "train_reward"), ("success_rate", "train_success")):
                if isinstance(value := row.get(key), (int, float)):
                    series[name].append([step, value])
        elif row.get("kind") == "eval" and isinstance(value := row.get("accuracy"), (int, float)):
            series["eval_accuracy"].append([step, value])
    return series


STEP_COLUMNS = (
    "step",
    "reward_mean",
    "transitions",
    "staleness",
    "update_is_weight_mean",
    "update_is_weight_max",
    "engine_busy",
    "trainer_busy",
    "tokens_per_s",
    "step_s",
)


def steps_of(rows: list[dict[str, Any]], last: int = 20) -> list[dict[str, Any]]:
    """The last training steps' rows, with what shows how they trained: the staleness of the calls trained on
    (transitions by versions behind the updated policy), the importance weights of the off-policy correction, how
    busy the engine and the trainer were."""
    train = [r for r in rows if r.get("kind") == "train"][-last:]
    return [{k: r.get(k) for k in STEP_COLUMNS} for r in train]


def transitions(run_dir: Path, rollout_id: str, step: int | None) -> list[dict[str, Any]]:
    """The trained calls of a rollout with their reward, return, advantage and weight, from its step's file."""
    if step is None:
        return []
    # the trainer numbers its files by the step that trained on them, which is the rollouts' step
    return [
        row for row in _jsonl(run_dir / "transitions" / f"step-{step}.jsonl") if row.get("rollout_id") == rollout_id
    ]
