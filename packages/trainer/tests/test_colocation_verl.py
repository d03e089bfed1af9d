"""The GPU path's choreography run for real on this CPU: verl's real worker group (its `to`, `export_weights`,
update and log-prob methods, called with the arguments a CUDA run passes) and a vLLM stand-in that behaves as vLLM's
sleep mode does (`vllm_stub.SleepModeVllm`: level 1 keeps the weights, level 2 discards them and the server answers
with wrong log-probs until they are reloaded), wired by the run's own `open_remote_engine` and `update_and_publish`.

Each of the review's findings fails here on the code before its fix:
1. `to("cuda")` fails verl's own assertion (`TrainingWorker.to` takes "device" or "cpu"); a `to` that returned
   early off CUDA leaves verl's move log empty;
2. full fine-tuning's log-prob check after a level-2 sleep reads discarded weights: the check fails;
3. the CUDA cache is emptied after the optimizer left, and vLLM wakes its weights before its KV cache.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import random
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console
from vllm_stub import SleepModeVllm

from agl.learn.transitions import Transition
from agl_trainer.engines.check import check_served_logprobs
from agl_trainer.engines.colocation import Colocation, TrainerTurnLogprobs, update_and_publish
from agl_trainer.policy.trainer import PolicyConfig

if importlib.util.find_spec("verl") is None and os.environ.get("AGL_SKIP_VERL_TESTS"):
    pytest.skip(
        'AGL_SKIP_VERL_TESTS is set and verl is not installed (pip install "agl-trainer[verl]")',
        allow_module_level=True,
    )

from agl_trainer.verl.backend import VerlPolicy

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def batch(seed: int = 0) -> list[Transition]:
    """Transitions of random tokens with advantages of both signs: an update that moves the weights."""
    rng = random.Random(seed)
    out = []
    for i in range(6):
        response = [rng.randrange(100, 2000) for _ in range(rng.randrange(3, 9))]
        out.append(
            Transition(
                rollout_id=f"r{i}",
                task_id="t",
                attempt_id="a",
                seq=0,
                agent_name=None,
                prompt_ids=[rng.randrange(100, 2000) for _ in range(rng.randrange(4, 12))],
                response_ids=response,
                response_mask=[1] * len(response),
                logprobs=None,
                model_version=None,
                call_ids=[f"c{i}"],
                advantage=(-1) ** i * 1.0,
                weight=1.0,
            )
        )
    return out


def start(
    tiny_model_dir: Path, tmp_path: Path, cfg: PolicyConfig, stack: ExitStack, *, colocated: bool
) -> tuple[VerlPolicy, SleepModeVllm, Colocation | None, Any, list[str]]:
    """What `TrainingRun._open_backends` does on GPUs: vLLM first (asleep when colocated), then verl's actor, then
    the engine backend with its first weights published and checked (`open_remote_engine`)."""
    from agl_trainer.engines.remote import open_remote_engine
    from agl_trainer.models import load_model

    events: list[str] = []
    vllm = stack.enter_context(SleepModeVllm(tiny_model_dir, events))
    sharing = None
    if colocated:
        sharing = Colocation(vllm.url, _Nothing(), level=1 if cfg.lora else 2, log=events)
        stack.callback(sharing.close)
        sharing.sleep_engine()
    policy = stack.enter_context(VerlPolicy(tiny_model_dir, cfg))
    if sharing is not None:
        sharing.policy = policy
    _, tokenizer = load_model(tiny_model_dir, device="cpu")
    backend, _, _ = open_remote_engine(
        url=vllm.url,
        vllm_python=None,
        model_path=tiny_model_dir,
        model=None,  # the driver holds no model when verl trains
        tokenizer=tokenizer,
        policy=policy,  # type: ignore[arg-type]
        run_dir=tmp_path,
        console=Console(quiet=True),
        stack=stack,
        sharing=sharing,
    )
    return policy, vllm, sharing, backend, events


class _Nothing:
    def to_device(self) -> None:
        pass

    def to_host(self) -> None:
        pass

    def update(self, transitions: Any) -> Any:
        raise AssertionError("no policy yet")


def checked(vllm: SleepModeVllm, policy: VerlPolicy, sharing: Colocation | None, model: str) -> float:
    """The engine check after a publication: the largest mean |served − trainer's| of its probes."""
    trainer: Any = policy if sharing is None else TrainerTurnLogprobs(policy, sharing)
    return max(r.mean_abs_diff for r in check_served_logprobs(vllm.url, trainer, [(model, None)]))


WAKE = [
    "vllm: POST /wake_up?tags=weights",
    "vllm: wake weights",
    "vllm: POST /wake_up?tags=kv_cache",
    "vllm: wake kv_cache",
]
# a turn of the trainer that changes no weights: vLLM keeps its own in host memory (level 1)
CHECK_TURN = [
    "vllm: POST /sleep?level=1",
    "vllm: sleep level=1",
    "trainer: to device",
    "trainer: to host, cache emptied",
    *WAKE,
]


def test_colocated_lora_runs_verls_moves_and_vllms_sleep_in_order(
    ray_cluster: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    with ExitStack() as stack:
        policy, vllm, sharing, backend, events = start(
            tiny_model_dir, tmp_path, PolicyConfig(lr=1e-2), stack, colocated=True
        )
        assert sharing is not None
        # start: vLLM asleep before the trainer exists, the first adapter written, the trainer's state off the GPUs
        # (its cache emptied), vLLM woken in verl's order (weights, then KV cache), given the adapter, then checked
        # on turns of the trainer that keep vLLM's weights
        assert events[:8] == [
            "vllm: POST /sleep?level=1",
            "vllm: sleep level=1",
            "trainer: to host, cache emptied",
            *WAKE,
            "vllm: POST /v1/load_lora_adapter",
        ]
        checks = events[8:]
        assert checks and checks == CHECK_TURN * (len(checks) // len(CHECK_TURN))
        moves = policy.moves()
        # verl's own `to`, with the arguments a CUDA run passes, alternating; the cache emptied on the way out
        assert [m["device"] for m in moves][:3] == ["cpu", "device", "cpu"]
        assert all(m["emptied_cache"] == (m["device"] == "cpu") for m in moves)
        assert all(m["model"] and m["optimizer"] and m["grad"] for m in moves)
        events.clear()
        before = len(moves)
        update_and_publish(policy, backend, copy.deepcopy(batch()), sharing)
        # the update's turn, then the new adapter once vLLM is awake
        assert events == [*CHECK_TURN, "vllm: POST /v1/load_lora_adapter"]
        assert [m["device"] for m in policy.moves()[before:]] == ["device", "cpu"]
        # what vLLM serves after the update is what the trainer computes
        assert checked(vllm, policy, sharing, backend.served_name("default")) < 1e-4


def test_colocated_full_finetuning_serves_the_trainers_weights_after_each_level_2_sleep(
    ray_cluster: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    with ExitStack() as stack:
        # the start-up check (inside `open_remote_engine`) already runs a trainer turn after the first reload
        policy, vllm, sharing, backend, events = start(
            tiny_model_dir, tmp_path, PolicyConfig(lora=False, lr=1e-3), stack, colocated=True
        )
        assert sharing is not None and sharing.level == 2
        assert vllm.reloads and not vllm.discarded_weights
        events.clear()
        update_and_publish(policy, backend, copy.deepcopy(batch()), sharing)  # the reload's check runs inside
        steps = [e for e in events if not e.startswith("vllm: POST")]
        assert steps[:7] == [
            "vllm: sleep level=2",  # the weights are replaced: nothing kept
            "trainer: to device",
            "trainer: to host, cache emptied",
            "vllm: wake weights",
            "vllm: weights reloaded",  # the update's weights, into the woken weight memory
            "vllm: wake kv_cache",
            "vllm: sleep level=1",  # the check's trainer turn keeps vLLM's weights
        ]
        assert events.index("vllm: POST /collective_rpc") < events.index("vllm: POST /wake_up?tags=kv_cache")
        assert events.count("vllm: POST /collective_rpc") == 1  # loaded once, not again by `serve`
        assert checked(vllm, policy, sharing, backend.served_name("default")) < 1e-4
        assert not vllm.discarded_weights


def test_split_layout_moves_nothing_and_serves_the_update(
    ray_cluster: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    with ExitStack() as stack:
        policy, vllm, sharing, backend, events = start(
            tiny_model_dir, tmp_path, PolicyConfig(lr=1e-2), stack, colocated=False
        )
        update_and_publish(policy, backend, copy.deepcopy(batch()), sharing)
        assert not [e for e in events if "sleep" in e or "wake" in e]
        assert policy.moves() == []
        assert checked(vllm, policy, None, backend.served_name("default")) < 1e-4


def test_a_lora_policy_on_a_bf16_base_trains_an_fp32_adapter(ray_cluster: None, tiny_model_dir: Path) -> None:
    """The CUDA profile's dtypes, run on this CPU: the frozen base loaded in bf16 (half of fp32's memory, as the plan
    charges it), the adapter the optimizer updates in fp32 (verl would cast an adapter it builds to bf16: the workers
    write a fresh one for it to load instead), and an update moves it."""
    from agl_trainer.verl.settings import VerlProfile

    profile = VerlProfile("cpu", "bf16", False, False, "sdpa", 4096, weights_dtype="bf16")
    with VerlPolicy(tiny_model_dir, PolicyConfig(lr=1e-2), profile=profile) as policy:
        assert policy.parameter_dtypes() == {"trained": ["float32"], "frozen": ["bfloat16"]}
        before = policy.state_dict_for_engine()
        assert all(v.dtype == torch.float32 for v in before.values())
        # peft's fresh adapter: B = 0, so the policy starts as the base model; A drawn, not zero
        assert all(not v.any() for k, v in before.items() if "lora_B" in k)
        assert all(v.abs().max() > 0 for k, v in before.items() if "lora_A" in k)
        stats = policy.update(copy.deepcopy(batch()))
        assert stats.grad_norm > 0
        after = policy.state_dict_for_engine()
        assert max((after[k] - before[k]).abs().max().item() for k in before) > 1e-4
