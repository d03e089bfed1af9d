"""The real bundled model (SmolLM2-135M-Instruct) completes training steps of the built-in calculator example on
CPU: rollouts through the proxy, updates of its LoRA adapter, evaluations before and after — and the first update
with advantages learned what they asked for: the trained calls' log-probs moved in their advantage's direction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agl.store import Store
from agl_trainer.examples import calculator
from agl_trainer.models import load_model, resolve_model
from agl_trainer.policy.trainer import PolicyConfig
from agl_trainer.run.loop import TrainConfig, TrainingRun

pytestmark = pytest.mark.slow


def test_bundled_model_trains_one_step(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    config = TrainConfig(
        agent="agl_trainer.examples.calculator:solve",
        train_tasks=calculator.train_tasks()[:3],
        eval_tasks=calculator.eval_tasks()[:2],
        run_dir=run_dir,
        # a second step in case the first has nothing to learn from: at 0.7 the model calls its tool about half
        # the time, but some questions it nearly always gets right or wrong, so all three groups of 4 can agree
        # (it happened in CI); two steps that both agree are far rarer. The first step with an advantage is checked.
        steps=2,
        checkpoint_every=1,  # each step's adapter kept: the one checked may be the first
        tasks_per_step=3,
        group_size=4,
        eval_every=2,
        workers=1,
        concurrency=8,
        temperature=0.7,
        policy=PolicyConfig(lr=3e-4),
        rollout_timeout_s=300,
    )
    summary = TrainingRun(config).run()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in rows] == [("eval", 0), ("train", 0), ("train", 1), ("eval", 2)]
    assert summary.eval_before is not None and 0.0 <= summary.eval_before <= 1.0
    learned: int | None = None  # the first step whose update had something to learn from
    for step, train in enumerate(rows[1:3]):
        assert train["rollouts"] == 12 and train["failed"] == 0 and train["transitions"] >= 12
        written = [
            json.loads(line) for line in (run_dir / "transitions" / f"step-{step}.jsonl").read_text().splitlines()
        ]
        assert {row["agent"] for row in written} == {"solver"}
        assert all(row["prompt_tokens"] > 300 for row in written)  # system prompt, tool schema, worked examples
        adapter = load_file(str(run_dir / "checkpoints" / f"step-{step + 1}" / "adapter" / "adapter_model.safetensors"))
        moved = any(float(t.abs().max()) > 0 for name, t in adapter.items() if "lora_B" in name)
        # the update moved the adapter exactly when some group disagreed (or an earlier step had moved it)
        if learned is None:
            assert moved == (train["update_skipped_zero_advantage"] < train["transitions"])
            learned = step if moved else None
    assert learned is not None, "no transition of either step had an advantage: nothing to learn from"

    # What the step learned: Σ_i w_i A_i · mean_j Δ log π(y_ij), the first-order change of the objective, must
    # be positive, computed here with plain forwards of the policy before it (the base model: LoRA begins as the
    # identity, and an earlier step with nothing to learn left it so) and the base model with the step's adapter,
    # at each call's sampling temperature.
    from peft import PeftModel

    written = [
        json.loads(line) for line in (run_dir / "transitions" / f"step-{learned}.jsonl").read_text().splitlines()
    ]
    by_call = {(row["rollout_id"], row["seq"]): row for row in written if row["advantage"] != 0}
    assert by_call
    with Store(run_dir) as store:
        calls = [
            c
            for d in store.rollout_details(list({rollout for rollout, _ in by_call}))
            for c in d.llm_calls
            if (c.rollout_id, c.seq) in by_call
        ]
    assert len(calls) == len(by_call) and all(c.temperature == 0.7 for c in calls)
    base, _ = load_model(resolve_model("bundled"), device="cpu")
    model = PeftModel.from_pretrained(base, str(run_dir / "checkpoints" / f"step-{learned + 1}" / "adapter"))
    shift = 0.0
    with torch.no_grad():
        for c in calls:
            prompt, response = c.prompt_ids or [], c.response_ids or []
            ids = torch.tensor([prompt + response])
            after = _logprobs(model(input_ids=ids).logits, len(prompt), response, c.temperature or 1.0)
            with model.disable_adapter():
                before = _logprobs(model(input_ids=ids).logits, len(prompt), response, c.temperature or 1.0)
            row = by_call[(c.rollout_id, c.seq)]
            shift += row["weight"] * row["advantage"] * float((after - before).mean())
    print(f"objective shift {shift:.3e}")
    assert shift > 0, shift


def _logprobs(logits: torch.Tensor, prompt_len: int, response: list[int], temperature: float) -> torch.Tensor:
    scores = torch.log_softmax(logits[0, prompt_len - 1 : -1].float() / temperature, -1)
    return scores.gather(1, torch.tensor(response)[:, None])
