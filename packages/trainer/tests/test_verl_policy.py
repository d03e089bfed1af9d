"""verl's PPO actor worker as agl's policy backend, on the tiny Llama, in real Ray worker processes.

The centre piece: on one fixed batch (weights, temperatures, clipped ratios, a merged turn, a zero advantage,
missing behaviour log-probs) agl's own `PolicyTrainer` and `VerlPolicy` give the same loss, statistics and first
update. Measured on the development machine (2 cores): the losses agree to ~1e-7, the LoRA weights after the step
to ~3e-6 and the log-probs after it to ~2e-6; the tolerances below are 1e-5 (losses, log-probs) and 2e-5
(weights after a step, which AdamW's first step amplifies for tiny gradients).

One Ray and one worker group serve the whole module (each test starts from the checkpoint taken at start-up).
Without verl these tests fail, saying what to install, unless AGL_SKIP_VERL_TESTS is set.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from agl.learn.transitions import Transition
from agl_trainer.models import load_model
from agl_trainer.policy.trainer import PolicyConfig, PolicyTrainer, wrap_lora

if importlib.util.find_spec("verl") is None and os.environ.get("AGL_SKIP_VERL_TESTS"):
    pytest.skip(
        'AGL_SKIP_VERL_TESTS is set and verl is not installed (pip install "agl-trainer[verl]")',
        allow_module_level=True,
    )

from agl_trainer.verl.backend import VerlPolicy

pytestmark = pytest.mark.slow

LOSS_TOL = 1e-5
WEIGHT_TOL = 2e-5


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    """One local Ray for the module; 4 logical CPUs so that a 2-rank policy fits beside the shared one."""
    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def config(**overrides: Any) -> PolicyConfig:
    return PolicyConfig(**{"lr": 1e-2, **overrides})


@pytest.fixture(scope="module")
def initial_adapter(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The adapter both trainers start from: A as peft draws it, B not zero, so that the policy is not the
    reference (the KL term is live) and the first update moves A as well as B."""
    model, _ = load_model(tiny_model_dir, device="cpu")
    torch.manual_seed(0)
    model = wrap_lora(model, config())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05)
    folder = tmp_path_factory.mktemp("verl") / "adapter0"
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def started(
    ray_cluster: None, tiny_model_dir: Path, initial_adapter: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[VerlPolicy, Path]]:
    policy = VerlPolicy(tiny_model_dir, config(), initial_adapter=initial_adapter)
    start = tmp_path_factory.mktemp("verl") / "ckpt0"
    policy.save(start)
    yield policy, start
    policy.close()


@pytest.fixture
def policy(started: tuple[VerlPolicy, Path]) -> VerlPolicy:
    """The module's policy, back at its start (verl's checkpoint: adapter, optimizer, scheduler), KL off."""
    policy, start = started
    policy.config.kl_coef = 0.0
    policy.load(start)
    return policy


def agl_twin(tiny_model_dir: Path, initial_adapter: Path, cfg: PolicyConfig) -> PolicyTrainer:
    """agl's own trainer on the same weights."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    model, tokenizer = load_model(tiny_model_dir, device="cpu")
    if cfg.lora:
        model = wrap_lora(model, cfg)
        set_peft_model_state_dict(model, load_file(str(initial_adapter / "adapter_model.safetensors")))
    return PolicyTrainer(model, cfg, pad_id=tokenizer.pad_token_id)


def fixed_batch(reference: PolicyTrainer, seed: int = 0) -> list[Transition]:
    """Eight transitions of random tokens: varied lengths, temperatures, weights and advantages (one zero), a
    merged turn (a response token the environment wrote), behaviour log-probs off the current policy by up to
    ±0.4 (so ratios leave the clip range), and one transition without behaviour log-probs."""
    rng = random.Random(seed)
    batch = []
    for i in range(8):
        prompt = [rng.randrange(100, 2000) for _ in range(rng.randrange(3, 14))]
        response = [rng.randrange(100, 2000) for _ in range(rng.randrange(2, 10))]
        mask = [1] * len(response)
        if i == 3:
            mask[1] = 0
        batch.append(
            Transition(
                rollout_id=f"r{i // 2}",
                task_id="t",
                attempt_id="a",
                seq=i,
                agent_name="solver",
                prompt_ids=prompt,
                response_ids=response,
                response_mask=mask,
                logprobs=None,
                model_version=None,
                call_ids=[f"c{i}"],
                advantage=0.0 if i == 5 else (-1) ** i * (0.5 + i / 4),
                weight=[1.0, 0.5, 0.25, 2.0][i % 4],
                temperature=[1.0, 0.7, 1.3][i % 3],
            )
        )
    for t, lp in zip(batch, reference.logprobs(batch), strict=True):
        t.logprobs = [x + rng.uniform(-0.4, 0.4) for x in lp]
    batch[6].logprobs = None
    return batch


def lora_state(trainer: PolicyTrainer) -> dict[str, torch.Tensor]:
    from peft import get_peft_model_state_dict

    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(trainer.model).items()}


def max_gap(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for xs, ys in zip(a, b, strict=True) for x, y in zip(xs, ys, strict=True))


def test_logprobs_equal_agls(policy: VerlPolicy, tiny_model_dir: Path, initial_adapter: Path) -> None:
    twin = agl_twin(tiny_model_dir, initial_adapter, config())
    batch = fixed_batch(twin)
    assert max_gap(policy.logprobs(batch), twin.logprobs(batch)) < LOSS_TOL
    # verl's reference (the adapter off) is agl's: the base model
    with twin.model.disable_adapter():
        base = twin.logprobs(batch)
    assert max_gap(policy.reference_logprobs(batch), base) < LOSS_TOL
    assert policy.timings["logprobs_s"] > 0


@pytest.mark.parametrize("kl_coef", [0.0, 0.3])
def test_same_loss_and_first_update_as_agl(
    policy: VerlPolicy, tiny_model_dir: Path, initial_adapter: Path, kl_coef: float
) -> None:
    policy.config.kl_coef = kl_coef
    twin = agl_twin(tiny_model_dir, initial_adapter, config(kl_coef=kl_coef))
    batch = fixed_batch(twin)
    theirs, ours = twin.update(copy.deepcopy(batch)), policy.update(copy.deepcopy(batch))

    assert ours.loss == pytest.approx(theirs.loss, abs=LOSS_TOL)
    assert ours.pg_loss == pytest.approx(theirs.pg_loss, abs=LOSS_TOL)
    assert ours.kl == pytest.approx(theirs.kl, abs=LOSS_TOL)
    assert (ours.kl > 0) == (kl_coef > 0)
    assert ours.clip_fraction == pytest.approx(theirs.clip_fraction, abs=1e-9)
    assert 0 < ours.clip_fraction < 1
    assert ours.ratio_mean == pytest.approx(theirs.ratio_mean, abs=LOSS_TOL)
    assert ours.grad_norm == pytest.approx(theirs.grad_norm, rel=1e-5)
    for name in ("tokens", "transitions", "skipped_zero_advantage", "recomputed_logprobs"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.recomputed_logprobs == 1 and ours.skipped_zero_advantage == (0 if kl_coef else 1)

    # the same step: the weights, and what they compute
    after = policy.state_dict_for_engine()
    expected = lora_state(twin)
    assert set(after) == set(expected)
    assert max((after[k] - expected[k]).abs().max().item() for k in expected) < WEIGHT_TOL
    assert max_gap(policy.logprobs(batch), twin.logprobs(batch)) < LOSS_TOL


def test_update_moves_logprobs_the_advantages_way(
    policy: VerlPolicy, tiny_model_dir: Path, initial_adapter: Path
) -> None:
    batch = fixed_batch(agl_twin(tiny_model_dir, initial_adapter, config()))[:2]
    batch[0].advantage, batch[1].advantage = 1.0, -1.0
    before = [sum(lp) for lp in policy.logprobs(batch)]
    for _ in range(3):
        for t, lp in zip(batch, policy.logprobs(batch), strict=True):
            t.logprobs = lp  # on-policy at every step
        stats = policy.update(batch)
    after = [sum(lp) for lp in policy.logprobs(batch)]
    assert after[0] - before[0] > 0.05 and after[1] - before[1] < -0.05, (before, after)
    assert stats.grad_norm > 0 and stats.tokens == sum(len(t.response_ids) for t in batch)


def test_nothing_to_learn_is_no_update(policy: VerlPolicy, tiny_model_dir: Path, initial_adapter: Path) -> None:
    batch = fixed_batch(agl_twin(tiny_model_dir, initial_adapter, config()))
    for t in batch:
        t.advantage = 0.0
    before = policy.state_dict_for_engine()
    stats = policy.update(batch)
    assert stats.skipped_zero_advantage == len(batch) and stats.tokens == 0
    after = policy.state_dict_for_engine()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_save_and_load_round_trip(
    policy: VerlPolicy, tiny_model_dir: Path, initial_adapter: Path, tmp_path: Path
) -> None:
    batch = fixed_batch(agl_twin(tiny_model_dir, initial_adapter, config()))
    policy.update(copy.deepcopy(batch))
    policy.save(tmp_path / "ckpt")
    saved = policy.logprobs(batch)
    next_step = policy.update(copy.deepcopy(batch))
    after_next = policy.logprobs(batch)
    assert max_gap(after_next, saved) > 1e-3  # the second step changed the policy

    policy.load(tmp_path / "ckpt")
    assert policy.steps == 1
    assert max_gap(policy.logprobs(batch), saved) < 1e-6
    # the optimizer's state came back too: the same second step again
    again = policy.update(copy.deepcopy(batch))
    assert again.grad_norm == pytest.approx(next_step.grad_norm, rel=1e-6)
    assert max_gap(policy.logprobs(batch), after_next) < 1e-6
    # the adapter beside verl's checkpoint is a peft folder
    assert (policy.adapter_folder(tmp_path / "ckpt") / "adapter_model.safetensors").is_file()


def test_the_weights_reach_a_local_model(
    policy: VerlPolicy, tiny_model_dir: Path, initial_adapter: Path, tmp_path: Path
) -> None:
    import json

    from peft import PeftModel

    batch = fixed_batch(agl_twin(tiny_model_dir, initial_adapter, config()))
    policy.update(copy.deepcopy(batch))
    trained = policy.logprobs(batch)

    # in place, into the embedded engine's model (its own adapter starts elsewhere)
    model, tokenizer = load_model(tiny_model_dir, device="cpu")
    torch.manual_seed(123)
    local = PolicyTrainer(wrap_lora(model, config()), config(), pad_id=tokenizer.pad_token_id)
    assert max_gap(local.logprobs(batch), trained) > 1e-3
    policy.load_into(local.model)
    assert max_gap(local.logprobs(batch), trained) < LOSS_TOL

    # as a peft folder, what vLLM's and agl's load_lora_adapter read
    folder = policy.save_adapter(tmp_path / "published")
    saved = json.loads((folder / "adapter_config.json").read_text())
    assert saved["r"] == 16 and saved["lora_alpha"] == 32 and saved["peft_type"] == "LORA"
    assert sorted(saved["target_modules"]) == sorted(config().lora_targets)
    base, _ = load_model(tiny_model_dir, device="cpu")
    loaded = PolicyTrainer(
        PeftModel.from_pretrained(base, str(folder), is_trainable=True), config(), pad_id=tokenizer.pad_token_id
    )
    assert max_gap(loaded.logprobs(batch), trained) < LOSS_TOL


def test_two_ranks_give_the_same_update_as_one(policy: VerlPolicy, tiny_model_dir: Path, initial_adapter: Path) -> None:
    batch = fixed_batch(agl_twin(tiny_model_dir, initial_adapter, config()))[:7]  # odd: one placeholder row
    one = policy.update(copy.deepcopy(batch))
    weights_one = policy.state_dict_for_engine()
    with VerlPolicy(tiny_model_dir, config(), initial_adapter=initial_adapter, workers=2) as two_ranks:
        two = two_ranks.update(copy.deepcopy(batch))
        weights_two = two_ranks.state_dict_for_engine()
        assert max_gap(two_ranks.logprobs(batch), policy.logprobs(batch)) < LOSS_TOL
    assert two.loss == pytest.approx(one.loss, abs=LOSS_TOL)
    assert two.grad_norm == pytest.approx(one.grad_norm, rel=1e-5)
    assert (two.clip_fraction, two.tokens, two.recomputed_logprobs) == (
        one.clip_fraction,
        one.tokens,
        one.recomputed_logprobs,
    )
    assert max((weights_two[k] - weights_one[k]).abs().max().item() for k in weights_one) < WEIGHT_TOL


def test_full_finetuning_same_update_as_agl(ray_cluster: None, tiny_model_dir: Path, initial_adapter: Path) -> None:
    cfg = config(lora=False, lr=1e-3)
    twin = agl_twin(tiny_model_dir, initial_adapter, cfg)
    batch = fixed_batch(twin)
    with VerlPolicy(tiny_model_dir, cfg) as full:
        assert max_gap(full.logprobs(batch), twin.logprobs(batch)) < LOSS_TOL
        theirs, ours = twin.update(copy.deepcopy(batch)), full.update(copy.deepcopy(batch))
        assert ours.loss == pytest.approx(theirs.loss, abs=LOSS_TOL)
        assert ours.grad_norm == pytest.approx(theirs.grad_norm, rel=1e-5)
        state = full.state_dict_for_engine()
        expected = twin.model.state_dict()
        assert max((state[k] - expected[k]).abs().max().item() for k in expected) < WEIGHT_TOL
        assert max_gap(full.logprobs(batch), twin.logprobs(batch)) < LOSS_TOL
        with pytest.raises(ValueError, match="needs LoRA"):
            full.save_adapter("unused")


def test_cpu_micro_batches_hold_the_logits_to_their_budget() -> None:
    from agl_trainer.verl.cpu import CPU_LOGITS_BYTES, cpu_micro_batch_tokens

    # SmolLM2's 49,152-token vocabulary: 4 float32 tensors of that width per token fill 2 GiB at 2,730 tokens
    assert CPU_LOGITS_BYTES == 2 * 2**30
    assert cpu_micro_batch_tokens(16384, 49152, longest=500) == 2730
    assert cpu_micro_batch_tokens(1024, 49152, longest=500) == 1024  # a smaller configured budget stays
    assert cpu_micro_batch_tokens(16384, 49152, longest=4000) == 4000  # never below a sequence verl cannot split
    assert cpu_micro_batch_tokens(16384, 256, longest=500) == 16384  # a tiny vocabulary fits the configured one


def test_full_finetuned_weights_reach_vllm_and_the_embedded_engine_from_the_actor(
    ray_cluster: None, tiny_model_dir: Path, initial_adapter: Path, tmp_path: Path
) -> None:
    from safetensors.torch import load_file
    from vllm_stub import RecordingVllm

    from agl_trainer.engines.publish import RemoteWeightsEngine

    cfg = config(lora=False, lr=1e-3)
    batch = fixed_batch(agl_twin(tiny_model_dir, initial_adapter, cfg))
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    with VerlPolicy(tiny_model_dir, cfg) as full, RecordingVllm() as vllm:
        full.update(copy.deepcopy(batch))
        actor = full.state_dict_for_engine()
        assert max((actor[k] - base[k]).abs().max().item() for k in base) > 1e-4  # the update moved the weights
        engine = RemoteWeightsEngine(vllm.url, full.save_pretrained, tmp_path / "published")
        engine.weights_changed()
        engine.close()
        # vLLM was pointed at the actor's weights, then its prefix cache reset (the reload keeps stale KV blocks)
        assert [c.split("?")[0] for c in vllm.calls] == ["POST /collective_rpc", "POST /reset_prefix_cache"]
        (received,) = vllm.weights
        assert set(received) >= set(base)
        assert all(torch.equal(received[k], actor[k]) for k in base)
        # the embedded engine's model gets the same weights in place
        model, _ = load_model(tiny_model_dir, device="cpu")
        full.load_into(model)
        local = model.state_dict()
        assert all(torch.equal(local[k], actor[k]) for k in base)


def test_a_policy_per_agent_changes_only_on_its_own_agents_transitions(
    ray_cluster: None, tiny_model_dir: Path, initial_adapter: Path, tmp_path: Path
) -> None:
    from agl_trainer.policy.trainer import agent_adapters
    from agl_trainer.verl.per_agent import PerAgentVerlPolicy

    adapters = agent_adapters(["speaker", "listener"])
    batch = fixed_batch(agl_twin(tiny_model_dir, initial_adapter, config()))
    for t in batch:
        t.agent_name = "speaker"

    def make(adapter: str) -> VerlPolicy:
        return VerlPolicy(tiny_model_dir, config(), initial_adapter=initial_adapter)

    with PerAgentVerlPolicy(adapters, make) as policies:
        speaker, listener = policies.policies[adapters["speaker"]], policies.policies[adapters["listener"]]
        before = {name: p.state_dict_for_engine() for name, p in policies.policies.items()}
        stats = policies.update(copy.deepcopy(batch))  # the speaker's transitions only
        assert stats.extra["transitions/speaker"] == len(batch) and "transitions/listener" not in stats.extra
        moved = speaker.state_dict_for_engine()
        kept = listener.state_dict_for_engine()
        assert max((moved[k] - before[adapters["speaker"]][k]).abs().max().item() for k in moved) > 1e-4
        assert all(torch.equal(kept[k], before[adapters["listener"]][k]) for k in kept)
        # the listener's own transitions move the listener, not the speaker
        for t in batch:
            t.agent_name = "listener"
        policies.update(copy.deepcopy(batch))
        assert all(torch.equal(speaker.state_dict_for_engine()[k], moved[k]) for k in moved)
        assert max((listener.state_dict_for_engine()[k] - kept[k]).abs().max().item() for k in kept) > 1e-4
        # each agent's adapter is saved where the engine loads it from
        policies.save(tmp_path / "ckpt")
        for adapter in adapters.values():
            assert (policies.adapter_folder(tmp_path / "ckpt", adapter) / "adapter_model.safetensors").is_file()
        with pytest.raises(ValueError, match="no policy of its own"):
            batch[0].agent_name = "critic"
            policies.logprobs(batch[:1])


@pytest.mark.parametrize("mode", ["tis", "mis"])
def test_same_off_policy_correction_as_agl(
    policy: VerlPolicy, tiny_model_dir: Path, initial_adapter: Path, mode: str
) -> None:
    """With the correction on, verl's update (π_old recomputed by its worker, the weights as its
    `rollout_is_weights`) is agl's: the same loss, weights' statistics and step. The fixed batch's behaviour
    log-probs are up to ±0.4 off the policy, so with a cap of 1.2 some weights are truncated or masked."""
    policy.config.is_cap, policy.config.is_mode = 1.2, mode
    try:
        twin = agl_twin(tiny_model_dir, initial_adapter, config(is_cap=1.2, is_mode=mode))
        batch = fixed_batch(twin)
        theirs, ours = twin.update(copy.deepcopy(batch)), policy.update(copy.deepcopy(batch))
    finally:
        policy.config.is_cap, policy.config.is_mode = None, "tis"
    assert ours.loss == pytest.approx(theirs.loss, abs=LOSS_TOL)
    assert ours.pg_loss == pytest.approx(theirs.pg_loss, abs=LOSS_TOL)
    assert ours.clip_fraction == pytest.approx(theirs.clip_fraction, abs=1e-9)
    assert ours.ratio_mean == pytest.approx(theirs.ratio_mean, abs=LOSS_TOL)
    assert ours.grad_norm == pytest.approx(theirs.grad_norm, rel=1e-5)
    correction = {k: v for k, v in theirs.extra.items() if k.startswith("is_")}
    assert correction.keys() == {k for k in ours.extra if k.startswith("is_")} and correction
    for key, value in correction.items():
        assert ours.extra[key] == pytest.approx(value, abs=1e-5), key
    assert correction["is_weight_max"] > 1.2
    # the same step. Adam's first step divides each gradient by its size: a weight whose gradient is ~0 (a token
    # the cap truncated contributes less) moves by float noise between the two trainers' forward layouts (verl's
    # worker recomputes π_old in micro-batches of its own), so a few weights differ by up to 10× the tolerance
    after, expected = policy.state_dict_for_engine(), lora_state(twin)
    gaps = torch.cat([(after[k] - expected[k]).abs().flatten() for k in expected])
    assert float(gaps.max()) < 10 * WEIGHT_TOL
    assert float((gaps > WEIGHT_TOL).float().mean()) < 1e-3, float((gaps > WEIGHT_TOL).float().mean())
