"""The real bundled model (SmolLM2-135M-Instruct) completes a training step of the built-in calculator example
on CPU: rollouts through the proxy, an update of its LoRA adapter, evaluations before and after."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from agl_trainer.examples import calculator
from agl_trainer.loop import TrainConfig, TrainingRun
from agl_trainer.policy import PolicyConfig

pytestmark = pytest.mark.slow


def test_bundled_model_trains_one_step(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    config = TrainConfig(
        agent="agl_trainer.examples.calculator:solve",
        train_tasks=calculator.train_tasks()[:2],
        eval_tasks=calculator.eval_tasks()[:2],
        run_dir=run_dir,
        steps=1,
        tasks_per_step=2,
        group_size=4,
        eval_every=1,
        workers=1,
        concurrency=8,
        temperature=1.0,
        policy=PolicyConfig(lr=3e-4),
        rollout_timeout_s=300,
    )
    summary = TrainingRun(config).run()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in rows] == [("eval", 0), ("train", 0), ("eval", 1)]
    train = rows[1]
    assert train["rollouts"] == 8 and train["failed"] == 0 and train["transitions"] >= 8
    assert summary.eval_before is not None and 0.0 <= summary.eval_before <= 1.0
    written = [json.loads(line) for line in (run_dir / "transitions" / "step-0.jsonl").read_text().splitlines()]
    assert {row["agent"] for row in written} == {"solver"}
    assert all(row["prompt_tokens"] > 300 for row in written)  # system prompt, tool schema, worked examples
    adapter = load_file(str(run_dir / "checkpoints" / "step-1" / "adapter" / "adapter_model.safetensors"))
    moved = any(float(t.abs().max()) > 0 for name, t in adapter.items() if "lora_B" in name)
    # with sampling at temperature 1, the 8 rollouts of 2 tasks almost surely disagree somewhere
    assert moved == (train["update_skipped_zero_advantage"] < train["transitions"])
