"""The policy trainer: its log-probs agree with the engine's, an update moves the policy the way the
advantages say, micro-batching does not change the update, KL and checkpoints work."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from agl.learn.transitions import Transition
from agl_trainer.chat_format import render_prompt
from agl_trainer.engines.embedded import Engine, GenerationRequest
from agl_trainer.models import load_model
from agl_trainer.policy.trainer import PolicyConfig, PolicyTrainer, wrap_lora


def fresh_policy(tiny_model_dir: Path, **overrides: Any) -> tuple[PolicyTrainer, Engine]:
    model, tokenizer = load_model(tiny_model_dir, device="cpu")
    config = PolicyConfig(**{"lr": 1e-2, **overrides})
    torch.manual_seed(0)  # LoRA's A matrices start random: the same start for every policy built here
    model = wrap_lora(model, config) if config.lora else model
    return PolicyTrainer(model, config, pad_id=tokenizer.pad_token_id), Engine(model, tokenizer).start()


def sample(engine: Engine, question: str, seed: int, advantage: float = 1.0) -> Transition:
    tok = engine.tokenizer
    prompt = list(tok(render_prompt(tok, [{"role": "user", "content": question}]), add_special_tokens=False).input_ids)
    result = engine.generate(GenerationRequest(prompt, max_tokens=8, temperature=1.0, seed=seed))
    return Transition(
        rollout_id="r",
        task_id="t",
        attempt_id="a",
        seq=seed,
        agent_name="x",
        prompt_ids=prompt,
        response_ids=result.token_ids,
        response_mask=[1] * len(result.token_ids),
        logprobs=result.logprobs,
        model_version=None,
        call_ids=[f"c{seed}"],
        advantage=advantage,
    )


def total_logprob(policy: PolicyTrainer, t: Transition) -> float:
    return sum(policy.logprobs([t])[0])


def test_trainer_logprobs_match_the_engines(tiny_model_dir: Path) -> None:
    policy, engine = fresh_policy(tiny_model_dir)
    try:
        batch = [sample(engine, q, seed) for seed, q in enumerate(["Hi", "What is a cat?", "Tell me more about it."])]
        for t, lp in zip(batch, policy.logprobs(batch), strict=True):
            assert lp == pytest.approx(t.logprobs, abs=1e-4)
    finally:
        engine.close()


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_update_follows_the_advantage(tiny_model_dir: Path, sign: float) -> None:
    policy, engine = fresh_policy(tiny_model_dir)
    try:
        t = sample(engine, "Say yes.", seed=1, advantage=sign)
        before = total_logprob(policy, t)
        lora_before = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
        for _ in range(3):
            stats = policy.update([t])
            t.logprobs = policy.logprobs([t])[0]  # on-policy again for the next step
        after = total_logprob(policy, t)
        assert (after - before) * sign > 0.05, (before, after)
        changed = [
            n for n, p in policy.model.named_parameters() if p.requires_grad and not torch.equal(p, lora_before[n])
        ]
        assert changed and all("lora" in n for n in changed)
        assert stats.tokens == len(t.response_ids) and stats.grad_norm > 0
    finally:
        engine.close()


def test_zero_advantages_do_not_step(tiny_model_dir: Path) -> None:
    policy, engine = fresh_policy(tiny_model_dir)
    try:
        stats = policy.update([sample(engine, "Hi", seed=2, advantage=0.0)])
        assert stats.skipped_zero_advantage == 1 and policy.steps == 0
    finally:
        engine.close()


def test_micro_batches_accumulate_to_the_same_update(tiny_model_dir: Path) -> None:
    results = []
    for budget in (100_000, 1):  # one pass, or one transition per pass
        policy, engine = fresh_policy(tiny_model_dir, micro_batch_tokens=budget)
        try:
            batch = [
                sample(engine, q, seed, advantage=a)
                for seed, (q, a) in enumerate([("Hi", 1.0), ("What is a dog?", -0.5), ("Count.", 2.0)])
            ]
            for t, w in zip(batch, [0.5, 0.25, 0.25], strict=True):
                t.weight = w
            stats = policy.update(batch)
            results.append(
                (
                    stats.micro_batches,
                    {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad},
                )
            )
        finally:
            engine.close()
    (one, a), (many, b) = results
    assert one == 1 and many == 3
    for name in a:
        assert torch.allclose(a[name], b[name], atol=1e-5), name


@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_the_prefix_run_once_per_update_gives_the_update_of_whole_sequences(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, kl_coef: float
) -> None:
    """The shared prompt beginning, run once with its gradients gathered over the micro-batches, changes nothing:
    against running every sequence whole (no prefix shared anywhere), the same log-probs and the same weights."""
    import agl_trainer.policy.packing
    import agl_trainer.policy.trainer

    results = []
    for share in (True, False):
        if not share:
            monkeypatch.setattr(agl_trainer.policy.trainer, "shared_prefix_ids", lambda transitions: [])
            monkeypatch.setattr(agl_trainer.policy.packing, "MIN_SHARED_PREFIX", 10**9)
        policy, engine = fresh_policy(tiny_model_dir, micro_batch_tokens=1, kl_coef=kl_coef)
        try:
            batch = [
                sample(engine, q, seed, advantage=a)
                for seed, (q, a) in enumerate([("Hi", 1.0), ("What is a dog?", -0.5), ("Count to three.", 2.0)])
            ]
            if share:
                assert (
                    len(agl_trainer.policy.trainer.shared_prefix_ids(batch))
                    >= agl_trainer.policy.packing.MIN_SHARED_PREFIX
                )
            logprobs = policy.logprobs(batch)
            policy.update(batch)
            weights = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
            results.append((logprobs, weights))
        finally:
            engine.close()
    (lp_shared, shared), (lp_whole, whole) = results
    for a, b in zip(lp_shared, lp_whole, strict=True):
        assert a == pytest.approx(b, abs=1e-5)
    for name in shared:
        assert torch.allclose(shared[name], whole[name], atol=1e-5), name
    assert any(not torch.equal(shared[n], fresh) for n, fresh in _initial_lora(tiny_model_dir).items())


def _initial_lora(tiny_model_dir: Path) -> dict[str, torch.Tensor]:
    policy, engine = fresh_policy(tiny_model_dir)
    engine.close()
    return {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}


def test_kl_to_the_base_model_and_checkpoints(tiny_model_dir: Path, tmp_path: Path) -> None:
    policy, engine = fresh_policy(tiny_model_dir, kl_coef=0.1)
    try:
        t = sample(engine, "Hello there", seed=3)
        first = policy.update([t])
        assert first.kl == pytest.approx(0.0, abs=1e-6)  # LoRA starts as the identity: policy == reference
        t.logprobs = policy.logprobs([t])[0]
        second = policy.update([t])
        assert second.kl > 0
        policy.save(tmp_path / "ckpt")
        expected = policy.logprobs([t])[0]
    finally:
        engine.close()
    restored, engine2 = fresh_policy(tiny_model_dir, kl_coef=0.1)
    try:
        assert restored.logprobs([t])[0] != pytest.approx(expected, abs=1e-6)
        restored.load(tmp_path / "ckpt")
        assert restored.logprobs([t])[0] == pytest.approx(expected, abs=1e-6)
        assert restored.steps == 2
    finally:
        engine2.close()


def test_kl_without_lora_is_refused(tiny_model_dir: Path) -> None:
    model, tokenizer = load_model(tiny_model_dir, device="cpu")
    with pytest.raises(ValueError, match="needs LoRA"):
        PolicyTrainer(model, PolicyConfig(lora=False, kl_coef=0.1), pad_id=tokenizer.pad_token_id)


def test_embedded_parts_implement_the_backend_interfaces(tiny_model_dir: Path) -> None:
    from agl_trainer.backends import InferenceBackend, PolicyBackend

    policy, engine = fresh_policy(tiny_model_dir)
    try:
        assert isinstance(policy, PolicyBackend) and isinstance(engine, InferenceBackend)
    finally:
        engine.close()
