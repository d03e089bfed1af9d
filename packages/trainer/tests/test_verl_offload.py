"""verl's offload branch, the one colocated GPU runs take, run for real on this CPU through agl's own call chain
(`VerlPolicy.to_host` / `to_device` → `AglActorWorker.to` → verl's `TrainingWorker.to` → `FSDPEngine.to`).

`FSDPEngine.to` picks its branch by comparing names: `to(get_device_name())` loads (`load_fsdp_model_to_gpu`,
`load_fsdp_optimizer`), `to("cpu")` offloads (`offload_fsdp_model_to_cpu`, `offload_fsdp_optimizer`). On a CPU the
device's name *is* "cpu", so both of agl's moves load and the offload functions never run (pinned below). Here verl
is told, in each worker, that its accelerator is named "cpu:0": a different name for the same memory, which torch
accepts wherever verl uses it (`tensor.to("cpu:0")`, `torch.tensor(..., device="cpu:0")`), so `to("cpu")` takes the
offload branch and `to("device")` the load branch, each calling verl's real functions on the real FSDP2 actor and
its AdamW state. Spies count the calls and pass them through.

It also checks what review item (d) asked about: the log-prob pass before an update can leave FSDP2 parameters
unsharded (the root module's always, when `reshard_after_forward` is off), and the offload must move shards only.
Here reshard_after_forward is off for every module, so the forward leaves the root and every layer unsharded, and
after verl's offload every parameter is a sharded DTensor again with no all-gathered storage left: torch's
`FSDPModule._apply` (what `module.to` runs) reshards each FSDP module before moving it, so agl needs no `reshard()`
of its own.
"""

from __future__ import annotations

import copy
import importlib.util
import math
import os
import random
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agl.learn.transitions import Transition
from agl_trainer.policy.trainer import PolicyConfig

if importlib.util.find_spec("verl") is None and os.environ.get("AGL_SKIP_VERL_TESTS"):
    pytest.skip(
        'AGL_SKIP_VERL_TESTS is set and verl is not installed (pip install "agl-trainer[verl]")',
        allow_module_level=True,
    )

from agl_trainer.verl.backend import VerlPolicy

pytestmark = pytest.mark.slow

VERL_ENGINE = "verl.workers.engine.fsdp.transformer_impl"  # FSDPEngine.to, and the move functions it imported
VERL_WORKERS = "verl.workers.engine_workers"  # TrainingWorker.to, which turns "device" into the device's name
OFFLOAD = ["offload_fsdp_model_to_cpu", "offload_fsdp_optimizer"]  # FSDPEngine.to("cpu")'s branch, on a GPU
LOAD = ["load_fsdp_model_to_gpu", "load_fsdp_optimizer"]  # FSDPEngine.to(<the device's name>)'s
MOVE_FUNCTIONS = (*OFFLOAD, *LOAD)
ACCELERATOR = "cpu:0"


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    import ray
    from ray import cloudpickle

    # the functions below run inside the workers, which cannot import this test module: sent by value
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def batch(seed: int = 0) -> list[Transition]:
    rng = random.Random(seed)
    out = []
    for i in range(4):
        response = [rng.randrange(100, 2000) for _ in range(rng.randrange(3, 7))]
        out.append(
            Transition(
                rollout_id=f"r{i}",
                task_id="t",
                attempt_id="a",
                seq=0,
                agent_name=None,
                prompt_ids=[rng.randrange(100, 2000) for _ in range(rng.randrange(4, 9))],
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


# ---------------------------------------------------------------------------------------- run inside each worker


def spy_on_moves(worker: Any) -> None:
    """verl's four move functions, as `FSDPEngine.to` looks them up, wrapped to record each call and run the real
    one."""
    import importlib

    engine = importlib.import_module(VERL_ENGINE)
    calls: list[str] = []
    worker._agl_test_calls = calls
    for name in MOVE_FUNCTIONS:
        real = getattr(engine, name)

        def spy(*args: Any, _real: Callable[..., Any] = real, _name: str = name, **kwargs: Any) -> Any:
            calls.append(_name)
            return _real(*args, **kwargs)

        setattr(engine, name, spy)


def name_the_accelerator(worker: Any) -> None:
    """verl's engine and worker told that the accelerator is named "cpu:0" (module globals they imported by name;
    nothing else in the process changes: verl's platform, agl's worker and torch still say "cpu")."""
    import importlib

    for module in (VERL_ENGINE, VERL_WORKERS):
        importlib.import_module(module).get_device_name = lambda: ACCELERATOR


def calls_since(worker: Any) -> list[str]:
    calls: list[str] = worker._agl_test_calls
    out = list(calls)
    calls.clear()
    return out


def layout(worker: Any) -> dict[str, Any]:
    """Where the actor's parameters and AdamW moments are, and whether any FSDP2 module holds all-gathered
    (unsharded) parameters: FSDP2's own state is read for that (private, and a test's business only)."""
    import torch
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor, Shard

    module = worker.actor.engine.module
    optimizer = worker.actor.engine.optimizer
    named = list(module.named_parameters())
    fsdp_modules = [m for m in module.modules() if isinstance(m, FSDPModule)]
    unsharded_modules = []
    unsharded_bytes = 0
    for m in fsdp_modules:
        groups = m._get_fsdp_state()._fsdp_param_groups
        if any(g.is_unsharded for g in groups):
            unsharded_modules.append("root" if m is module else type(m).__name__)
        for group in groups:
            for param in group.fsdp_params:
                for tensor in [*param.all_gather_outputs, *param._unsharded_inner_tensors]:
                    unsharded_bytes += tensor.untyped_storage().nbytes()
    moments = [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    return {
        "world": torch.distributed.get_world_size(),
        "root_is_fsdp": isinstance(module, FSDPModule),
        "fsdp_modules": len(fsdp_modules),
        "unsharded_modules": unsharded_modules,
        "unsharded_bytes": unsharded_bytes,
        "plain_params": [n for n, p in named if not isinstance(p, DTensor)],
        "not_shard_placed": [
            n for n, p in named if isinstance(p, DTensor) and not all(isinstance(x, Shard) for x in p.placements)
        ],
        "param_devices": sorted({(p.to_local() if isinstance(p, DTensor) else p).device.type for _, p in named}),
        "moments": len(moments),
        "moment_devices": sorted({(v.to_local() if isinstance(v, DTensor) else v).device.type for v in moments}),
    }


# ---------------------------------------------------------------------------------------- the test


def on_workers(policy: VerlPolicy, fn: Callable[[Any], Any]) -> list[Any]:
    import ray

    return list(ray.get([w.__ray_call__.remote(fn) for w in policy._wg._workers]))


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_colocated_turns_run_verls_offload_and_load_and_move_only_shards(
    ray_cluster: None, tiny_model_dir: Any, lora: bool
) -> None:
    overrides = {"actor.fsdp_config.reshard_after_forward": False}  # the forward leaves every module unsharded
    config = PolicyConfig(lora=lora, lr=1e-2 if lora else 1e-3)
    with VerlPolicy(tiny_model_dir, config, workers=2, num_cpus=2, overrides=overrides) as policy:
        on_workers(policy, spy_on_moves)
        # unaided, a CPU "offloads" through verl's load branch: the GPU's offload functions never run
        policy.to_host()
        assert on_workers(policy, calls_since) == [LOAD, LOAD]

        on_workers(policy, name_the_accelerator)
        # a colocated update's turn, as `update_and_publish` runs it: the trainer onto the accelerator, the update
        # (which gives AdamW its moments), the log-prob pass the next update starts with, then back to the host
        policy.to_device()
        assert on_workers(policy, calls_since) == [LOAD, LOAD]
        stats = policy.update(copy.deepcopy(batch()))
        assert math.isfinite(stats.grad_norm) and stats.grad_norm > 0
        before = policy.logprobs(batch())
        for state in on_workers(policy, layout):
            assert state["world"] == 2 and state["root_is_fsdp"] and state["fsdp_modules"] > 1
            # what review item (d) feared: the root (and here every layer) still holds its gathered parameters
            assert "root" in state["unsharded_modules"] and state["unsharded_bytes"] > 0
            assert state["moments"] > 0

        policy.to_host()
        assert on_workers(policy, calls_since) == [OFFLOAD, OFFLOAD]
        for state in on_workers(policy, layout):
            # verl's offload moved shards only: every parameter a Shard-placed DTensor on the host, no gathered
            # storage left anywhere, AdamW's moments on the host too
            assert state["unsharded_modules"] == [] and state["unsharded_bytes"] == 0
            assert state["plain_params"] == [] and state["not_shard_placed"] == []
            assert state["param_devices"] == ["cpu"] and state["moment_devices"] == ["cpu"]
            assert state["moments"] > 0
        moves = policy.moves()
        assert moves[-1]["device"] == "cpu" and moves[-1]["emptied_cache"]

        # back on the "accelerator": the same policy, and it trains on with the moments it got back
        policy.to_device()
        assert on_workers(policy, calls_since) == [LOAD, LOAD]
        after = policy.logprobs(batch())
        assert after == before
        stats = policy.update(copy.deepcopy(batch(seed=1)))
        assert math.isfinite(stats.grad_norm) and stats.grad_norm > 0
        policy.to_host()
        assert on_workers(policy, calls_since) == [OFFLOAD, OFFLOAD]
