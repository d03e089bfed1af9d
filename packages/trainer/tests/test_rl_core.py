"""The RL core against independent references, on a tiny Llama whose LoRA adapter starts away from the identity.

Each reference below is written out by hand here, not taken from `agl_trainer.policy.trainer`: per-transition forward
passes without packing, the clipped objective as its case analysis, k3 from its definition, temperature as a
division of the logits. Each test also names the mistake it exists to catch (removing the clip, reversing the KL
estimator, recording temperature-1 log-probs, keeping a stale prefix cache, ...).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from agl.learn.transitions import Transition
from agl_trainer.chat_format import render_prompt
from agl_trainer.engines.embedded import Engine, GenerationRequest
from agl_trainer.models import load_model
from agl_trainer.policy.trainer import PolicyConfig, PolicyTrainer, wrap_lora

CLIP_LOW, CLIP_HIGH = 0.2, 0.28
SYSTEM = "You are a careful assistant. Answer briefly and use the tools you were given when they help you."


@pytest.fixture
def policy(tiny_model_dir: Path) -> Iterator[PolicyTrainer]:
    yield make_policy(tiny_model_dir)


@pytest.fixture
def tok(tiny: tuple[Any, Any]) -> Any:
    return tiny[1]


def make_policy(tiny_model_dir: Path, **overrides: Any) -> PolicyTrainer:
    model, tokenizer = load_model(tiny_model_dir, device="cpu")
    config = PolicyConfig(
        **{"lr": 1e-3, "clip_low": CLIP_LOW, "clip_high": CLIP_HIGH, "max_grad_norm": 1e9, **overrides}
    )
    torch.manual_seed(0)
    model = wrap_lora(model, config)
    # LoRA's B starts at 0 (the adapter is the identity, A gets no gradient, KL to the base is 0): move it, so
    # every term of the loss is alive
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.3)
    return PolicyTrainer(model, config, pad_id=tokenizer.pad_token_id)


def prompt(tokenizer: Any, question: str) -> list[int]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return list(tokenizer(render_prompt(tokenizer, messages), add_special_tokens=False).input_ids)


def transition(prompt_ids: list[int], response: list[int], advantage: float, **kw: Any) -> Transition:
    return Transition(
        rollout_id=kw.pop("rollout_id", "r"),
        task_id="t",
        attempt_id="a",
        seq=0,
        agent_name="x",
        prompt_ids=prompt_ids,
        response_ids=response,
        response_mask=kw.pop("mask", [1] * len(response)),
        logprobs=None,
        model_version=None,
        call_ids=[f"c{len(response)}"],
        advantage=advantage,
        **kw,
    )


def reference_logprobs(model: Any, t: Transition, *, base: bool = False) -> torch.Tensor:
    """log softmax(logits / T) of each response token, from one unpacked forward of this transition alone."""
    ids = torch.tensor([t.prompt_ids + t.response_ids])
    if base:
        with model.disable_adapter():
            logits = model(input_ids=ids).logits[0]
    else:
        logits = model(input_ids=ids).logits[0]
    n = len(t.prompt_ids)
    scores = torch.log_softmax(logits[n - 1 : -1].float() / t.temperature, dim=-1)
    return scores.gather(1, torch.tensor(t.response_ids)[:, None])[:, 0]


def clipped_objective(ratio: float, advantage: float) -> float:
    """min(r A, clip(r, 1 − ε_low, 1 + ε_high) A), as its cases: above the band a positive advantage gains no
    more, below it a negative one loses no more; everywhere else the objective is r A."""
    if advantage >= 0 and ratio > 1 + CLIP_HIGH:
        return (1 + CLIP_HIGH) * advantage
    if advantage < 0 and ratio < 1 - CLIP_LOW:
        return (1 - CLIP_LOW) * advantage
    return ratio * advantage


def trainer_gradients(policy: PolicyTrainer, batch: Sequence[Transition]) -> tuple[Any, dict[str, torch.Tensor]]:
    """Run `policy.update` and keep the gradients it had just before its optimizer stepped."""
    grads: dict[str, torch.Tensor] = {}
    optimizer = policy.optimizers[None]
    step = optimizer.step

    def keep_then_step(*args: Any, **kwargs: Any) -> Any:
        grads.update({n: p.grad.detach().clone() for n, p in policy.model.named_parameters() if p.grad is not None})
        return step(*args, **kwargs)

    optimizer.step = keep_then_step  # type: ignore[method-assign]
    stats = policy.update(batch)
    return stats, grads


def reference_gradients(policy: PolicyTrainer, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    policy.model.zero_grad(set_to_none=True)
    loss.backward()
    out = {n: p.grad.detach().clone() for n, p in policy.model.named_parameters() if p.grad is not None}
    policy.model.zero_grad(set_to_none=True)
    return out


def assert_same_gradients(ours: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> None:
    assert ours.keys() == reference.keys() and ours
    for name, g in reference.items():
        assert torch.allclose(ours[name], g, rtol=1e-3, atol=1e-7), (name, (ours[name] - g).abs().max())
    assert any(float(g.abs().max()) > 1e-5 for g in reference.values())


def test_clipped_objective_value_gradient_and_clip_fraction_against_a_hand_computed_loss(
    policy: PolicyTrainer, tok: Any
) -> None:
    """Several transitions sharing a prompt prefix, uneven responses, both advantage signs, ratios inside, above
    and below the clip band, two temperatures. Catches: no clip, a symmetric clip, the wrong band edge for a
    sign, a wrong per-transition mean or weight, packing errors, and a clip fraction that ignores the sign."""
    model = policy.model
    shared = prompt(tok, "What is 12 times 7?")
    other = prompt(tok, "Name a prime above 20.")
    batch = [
        transition(shared, [1234, 77, 3001, 15], advantage=1.5, weight=0.5),
        transition(shared, [411, 9], advantage=-0.7, weight=0.25, temperature=0.7),
        transition(other, [88, 1200, 301, 45, 2, 618], advantage=0.4, weight=0.25),
    ]
    # the ratio each response token will have at the start of the update: in the band, above it, below it
    ratios = [[1.0, 1.5, 0.5, 1.1], [0.5, 1.5], [1.1, 2.0, 0.6, 0.9, 1.2, 1.0]]
    new = [reference_logprobs(model, t) for t in batch]
    for t, lp, r in zip(batch, new, ratios, strict=True):
        t.logprobs = [float(v) - math.log(x) for v, x in zip(lp.detach(), r, strict=True)]

    total_weight = sum(t.weight for t in batch)
    loss = torch.zeros(())
    expected_value = 0.0
    removed = 0
    for t, lp in zip(batch, new, strict=True):
        terms = []
        for j, old in enumerate(t.logprobs or []):
            ratio_t = torch.exp(lp[j] - old)
            ratio = float(ratio_t.detach())
            value = clipped_objective(ratio, t.advantage)
            # a clipped token's objective is the constant band edge: no gradient through it
            clipped = value != ratio * t.advantage
            removed += clipped
            terms.append(-(torch.tensor(value) if clipped else ratio_t * t.advantage))
            expected_value += -value * t.weight / total_weight / len(t.response_ids)
        loss = loss + torch.stack(terms).mean() * t.weight / total_weight
    expected = reference_gradients(policy, loss)
    assert removed == 3  # 1.5 and 2.0 with A > 0, 0.5 with A < 0; 0.5 with A > 0 and 1.5 with A < 0 still learn

    stats, ours = trainer_gradients(policy, batch)
    assert stats.pg_loss == pytest.approx(expected_value, rel=1e-4)
    assert stats.loss == pytest.approx(float(loss), rel=1e-4)
    assert stats.clip_fraction == pytest.approx(removed / 12)
    assert_same_gradients(ours, expected)


def test_kl_value_and_gradient_against_k3_and_zero_advantages_keep_their_kl(tiny_model_dir: Path, tok: Any) -> None:
    """k3 = exp(d) − d − 1 with d = log π_ref − log π_θ (the base model as reference), at the sampling
    temperature. All advantages are 0 here: their transitions must still be trained for their KL term.
    Catches: the reversed estimator (d = log π_θ − log π_ref), a missing temperature in the reference, dropping
    zero-advantage transitions with KL on, and a wrong KL coefficient."""
    beta = 0.3
    policy = make_policy(tiny_model_dir, kl_coef=beta)
    batch = [
        transition(prompt(tok, "Say hello."), [905, 33, 12], advantage=0.0, temperature=0.8),
        transition(prompt(tok, "Say goodbye, please."), [71, 1402], advantage=0.0),
    ]
    total_weight = sum(t.weight for t in batch)
    loss = torch.zeros(())
    tokens, kl_sum = 0, 0.0
    for t in batch:
        lp = reference_logprobs(policy.model, t)
        with torch.no_grad():
            ref = reference_logprobs(policy.model, t, base=True)
        t.logprobs = lp.detach().tolist()  # on-policy: ratio 1, and A = 0 anyway
        d = ref - lp
        k3 = torch.exp(d) - d - 1
        loss = loss + beta * k3.mean() * t.weight / total_weight
        kl_sum += float(k3.sum())
        tokens += len(t.response_ids)
    expected = reference_gradients(policy, loss)

    stats, ours = trainer_gradients(policy, batch)
    assert stats.skipped_zero_advantage == 0 and policy.steps == 1
    assert stats.kl == pytest.approx(kl_sum / tokens, rel=1e-4) and stats.kl > 1e-3
    assert stats.loss == pytest.approx(float(loss), rel=1e-4)
    assert_same_gradients(ours, expected)


def test_zero_advantages_without_kl_are_skipped(policy: PolicyTrainer) -> None:
    t = transition(list(range(100, 140)), [5, 6], advantage=0.0)
    t.logprobs = [-1.0, -2.0]
    stats = policy.update([t])
    assert stats.skipped_zero_advantage == 1 and policy.steps == 0


def test_the_engine_records_and_the_trainer_computes_log_probs_at_the_sampling_temperature(
    tiny_model_dir: Path,
) -> None:
    """At T = 0.7 the engine samples from softmax(z / 0.7) and must record those log-probs; the trainer must
    compute the same for a transition sampled at 0.7. Catches temperature-1 log-probs on either side."""
    model, tokenizer = load_model(tiny_model_dir, device="cpu")
    engine = Engine(model, tokenizer).start()
    try:
        ids = prompt(tokenizer, "Tell me a story about a cat.")
        result = engine.generate(GenerationRequest(ids, max_tokens=10, temperature=0.7, seed=3))
    finally:
        engine.close()
    t = transition(ids, result.token_ids, advantage=1.0, temperature=0.7)
    with torch.no_grad():
        tempered = reference_logprobs(model, t).tolist()
        plain = reference_logprobs(model, transition(ids, result.token_ids, advantage=1.0)).tolist()
    assert result.logprobs == pytest.approx(tempered, abs=1e-4)
    assert result.logprobs != pytest.approx(plain, abs=1e-2)  # the check can tell the two apart
    trainer = PolicyTrainer(model, PolicyConfig(lora=False), pad_id=tokenizer.pad_token_id)
    assert trainer.logprobs([t])[0] == pytest.approx(tempered, abs=1e-4)


def test_greedy_requests_record_temperature_one_log_probs(tiny_model_dir: Path) -> None:
    model, tokenizer = load_model(tiny_model_dir, device="cpu")
    engine = Engine(model, tokenizer).start()
    try:
        ids = prompt(tokenizer, "Count to three.")
        result = engine.generate(GenerationRequest(ids, max_tokens=6, temperature=0))
    finally:
        engine.close()
    with torch.no_grad():
        expected = reference_logprobs(model, transition(ids, result.token_ids, advantage=1.0)).tolist()
    assert result.logprobs == pytest.approx(expected, abs=1e-4)


def test_packed_log_probs_equal_unpacked_forwards(policy: PolicyTrainer, tok: Any) -> None:
    """A shared prefix run once for the batch, left padding, uneven responses: per-token log-probs equal one
    forward per transition. (The gradients through packing are checked by the clipped-objective test.)"""
    shared = prompt(tok, "A long shared beginning: system prompt, tools and worked examples.")
    batch = [
        transition(shared, [10, 11, 12, 13, 14, 15, 16], advantage=1.0),
        transition([*shared, 900, 901], [20], advantage=1.0),
        transition(shared[:-3], [30, 31, 32], advantage=1.0, temperature=0.5),
    ]
    packed = policy.logprobs(batch)
    with torch.no_grad():
        for t, lp in zip(batch, packed, strict=True):
            assert lp == pytest.approx(reference_logprobs(policy.model, t).tolist(), abs=2e-5)


def test_missing_or_misaligned_behaviour_log_probs_are_recomputed_and_counted(policy: PolicyTrainer) -> None:
    """An agent's `logprobs: false` or a backend that sent none must not stop training: the policy's own
    log-probs stand in (ratio 1 at the start of the update) and the step counts them."""
    a = transition(list(range(200, 240)), [7, 8, 9], advantage=1.0)
    b = transition(list(range(300, 330)), [4, 5], advantage=-1.0)
    b.logprobs = [-1.0]  # one log-prob for two tokens
    stats = policy.update([a, b])
    assert stats.recomputed_logprobs == 2 and policy.steps == 1
    assert stats.ratio_mean == pytest.approx(1.0, abs=1e-5) and stats.clip_fraction == 0.0
    assert a.logprobs is not None and len(a.logprobs) == 3


def test_the_prefix_cache_is_dropped_when_the_weights_change(tiny_model_dir: Path) -> None:
    """A prompt served before an update must be served with the new weights after it. Catches a no-op
    `weights_changed` (the prompt's cached keys/values from the old weights would be reused)."""
    model, tokenizer = load_model(tiny_model_dir, device="cpu")
    engine = Engine(model, tokenizer).start()
    try:
        ids = prompt(tokenizer, "The same long prompt, asked before and after the update.")
        engine.generate(GenerationRequest(ids, max_tokens=4, temperature=0))
        assert engine.prefix_cache.entries  # the prompt's beginning is cached
        with engine.lock, torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        engine.weights_changed()
        after = engine.generate(GenerationRequest(ids, max_tokens=6, temperature=1.0, seed=5))
    finally:
        engine.close()
    with torch.no_grad():
        expected = reference_logprobs(model, transition(ids, after.token_ids, advantage=1.0)).tolist()
    assert after.logprobs == pytest.approx(expected, abs=1e-4)


def _off_policy_batch(policy: PolicyTrainer, tok: Any, weights: list[list[float]]) -> list[Transition]:
    """Transitions whose behaviour log-probs μ sit log w below the policy's own: importance weights π_old / μ = w
    (π_old, recomputed before the update, is the policy as it is)."""
    shared = prompt(tok, "What is 12 times 7?")
    batch = [
        transition(shared, [1234, 77, 3001, 15], advantage=1.5, weight=0.5),
        transition(shared, [411, 9], advantage=-0.7, weight=0.25, temperature=0.7),
        transition(prompt(tok, "Name a prime above 20."), [88, 1200, 301], advantage=0.4, weight=0.25),
    ]
    for t, w in zip(batch, weights, strict=True):
        with torch.no_grad():
            lp = reference_logprobs(policy.model, t)
        t.logprobs = [float(v) - math.log(x) for v, x in zip(lp, w, strict=True)]
    return batch


def test_truncated_importance_weights_against_a_hand_computed_loss(tiny_model_dir: Path, tok: Any) -> None:
    """Behaviour log-probs that are not the policy's (a stale version, another precision): the clip acts on
    π_θ / π_old with π_old recomputed, and each token's term is weighted by min(π_old / μ, cap). Catches: weights
    left out, weights not truncated, the clip taken against μ, gradients through the weights."""
    cap = 2.0
    policy = make_policy(tiny_model_dir, is_cap=cap)
    weights = [[0.5, 3.0, 1.0, 1.2], [4.0, 0.9], [1.0, 1.0, 2.5]]
    batch = _off_policy_batch(policy, tok, weights)
    total_weight = sum(t.weight for t in batch)
    loss = torch.zeros(())
    for t, w in zip(batch, weights, strict=True):
        lp = reference_logprobs(policy.model, t)
        # π_old = the policy now: every ratio starts at 1, inside the band; the weight scales the term
        terms = [-min(x, cap) * torch.exp(lp[j] - lp[j].detach()) * t.advantage for j, x in enumerate(w)]
        loss = loss + torch.stack(terms).mean() * t.weight / total_weight
    expected = reference_gradients(policy, loss)

    stats, ours = trainer_gradients(policy, batch)
    assert_same_gradients(ours, expected)
    flat = [x for w in weights for x in w]
    assert stats.extra["is_weight_mean"] == pytest.approx(sum(flat) / len(flat), rel=1e-4)
    assert stats.extra["is_weight_max"] == pytest.approx(4.0, rel=1e-4)
    assert stats.extra["is_truncated_fraction"] == pytest.approx(3 / 9)  # 3.0, 4.0 and 2.5 above the cap
    assert stats.clip_fraction == 0.0


def test_masked_importance_sampling_drops_a_transition_whose_weights_stray(tiny_model_dir: Path, tok: Any) -> None:
    """MIS: a transition whose weights' geometric mean leaves [1/cap, cap] is left out whole; the others count
    unweighted."""
    policy = make_policy(tiny_model_dir, is_cap=2.0, is_mode="mis")
    weights = [[0.5, 3.0, 1.0, 1.2], [4.0, 3.0], [1.0, 1.0, 2.5]]  # geometric means 1.10, 3.46, 1.36
    batch = _off_policy_batch(policy, tok, weights)
    total_weight = sum(t.weight for t in batch)
    loss = torch.zeros(())
    for i, t in enumerate(batch):
        lp = reference_logprobs(policy.model, t)
        keep = 0.0 if i == 1 else 1.0
        terms = [-keep * torch.exp(lp[j] - lp[j].detach()) * t.advantage for j in range(len(lp))]
        loss = loss + torch.stack(terms).mean() * t.weight / total_weight
    expected = reference_gradients(policy, loss)

    stats, ours = trainer_gradients(policy, batch)
    assert_same_gradients(ours, expected)
    assert stats.extra["is_masked_fraction"] == pytest.approx(1 / 3)


def test_with_behaviour_equal_to_the_policy_the_correction_changes_nothing(tiny_model_dir: Path, tok: Any) -> None:
    """Weights of 1: the corrected update's gradients are today's, and the metrics say 1."""
    plain, corrected = make_policy(tiny_model_dir), make_policy(tiny_model_dir, is_cap=2.0)
    ones = [[1.0] * 4, [1.0] * 2, [1.0] * 3]
    _, expected = trainer_gradients(plain, _off_policy_batch(plain, tok, ones))
    stats, ours = trainer_gradients(corrected, _off_policy_batch(corrected, tok, ones))
    assert_same_gradients(ours, expected)
    assert stats.extra["is_weight_mean"] == pytest.approx(1.0, abs=1e-5)
    assert stats.extra["is_truncated_fraction"] == 0.0
    assert "is_weight_mean" not in plain.update(_off_policy_batch(plain, tok, ones)).extra  # off: no metrics


def test_an_engine_in_bf16_gives_weights_that_are_not_one(tiny_model_dir: Path, tok: Any) -> None:
    """The engine samples in bf16, the trainer computes in fp32 (both on CPU here): the behaviour log-probs are
    not the trainer's, and the correction reports it."""
    policy = make_policy(tiny_model_dir, is_cap=2.0)
    engine_model, _ = load_model(tiny_model_dir, device="cpu", dtype=torch.bfloat16)
    engine_model = wrap_lora(engine_model, policy.config)
    engine_model.load_state_dict({k: v.to(torch.bfloat16) for k, v in policy.model.state_dict().items()})
    batch = _off_policy_batch(policy, tok, [[1.0] * 4, [1.0] * 2, [1.0] * 3])
    for t in batch:
        with torch.no_grad():
            t.logprobs = [float(v) for v in reference_logprobs(engine_model, t)]
    stats = policy.update(batch)
    assert stats.extra["is_weight_mean"] != pytest.approx(1.0, abs=1e-6)
    assert stats.extra["is_weight_max"] > 1.0
    assert 0.5 < stats.extra["is_weight_mean"] < 2.0  # the same weights, another precision: close to 1


@pytest.mark.parametrize(("overrides", "message"), [({"is_mode": "x"}, "is_mode"), ({"is_cap": 1.0}, "is_cap")])
def test_bad_correction_settings_are_refused(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PolicyConfig(**overrides)
