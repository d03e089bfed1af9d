"""verl's PPO actor worker, as agl runs it: `ActorRolloutRefWorker` (role "actor") with three additions.

- `to(device, ...)` is verl's own (it takes "device", meaning the accelerator, or "cpu"; anything else fails its
  assertion), followed on the way out by what verl's colocated flow does before vLLM takes the GPU back and verl's
  `FSDPEngine.to("cpu")` does not: a device synchronize and `empty_cache` after the optimizer's moments left (verl
  empties the cache after the model only, so AdamW's state, twice the trained weights in fp32, would stay reserved
  by PyTorch's caching allocator). Each move is logged (`moves()`), with the allocator's figures after it.
- On the CPU the process group is started with plain ``gloo`` before verl starts it (verl would ask for
  ``cpu:gloo,cpu:gloo``, which torch refuses), and torch gets the threads agl gave the worker.
- `export_weights` hands the trained weights to the caller as full CPU tensors, gathered once, on rank 0: the LoRA
  adapter in peft's format (what `save_pretrained` writes and vLLM's `load_lora_adapter` reads) or, when fully
  fine-tuned, the model's state dict. verl's own weight export feeds its rollout engines; agl's inference side is elsewhere.

Everything else — log-probs, the update, checkpoints — is verl's worker unchanged. This module is imported in the
Ray workers (and by the driver to name the class); it needs verl.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from verl.single_controller.base.decorator import Dispatch, register
from verl.utils.device import get_device_name, get_torch_device
from verl.utils.distributed import initialize_global_process_group_ray
from verl.workers.engine_workers import ActorRolloutRefWorker

from agl_trainer.verl.placement import VLLM_GPUS_ENV, gpu_clash

THREADS_ENV = "AGL_VERL_THREADS"
# set (to the seed) when the worker writes the fresh LoRA adapter verl loads (agl_trainer.verl.adapter says why)
FRESH_ADAPTER_ENV = "AGL_VERL_FRESH_ADAPTER_SEED"


class AglActorWorker(ActorRolloutRefWorker):  # type: ignore[misc]
    def __init__(self, config: Any, role: str, **kwargs: Any) -> None:
        super().__init__(config, role, **kwargs)
        self._moves: list[dict[str, Any]] = []
        self._resident_before_model = _proc_status_bytes("VmRSS")  # init_model() loads the model after this
        threads = int(os.environ.get(THREADS_ENV) or 0)
        if threads > 0:
            torch.set_num_threads(threads)
        if os.environ.get(VLLM_GPUS_ENV):  # the split layout: this rank must not share a GPU with vLLM
            import ray

            vllm = [int(g) for g in os.environ[VLLM_GPUS_ENV].split(",")]
            clash = gpu_clash(ray.get_gpu_ids(), vllm, ray.util.get_node_ip_address())
            if clash is not None:
                raise RuntimeError(clash)
        if get_device_name() == "cpu":
            initialize_global_process_group_ray(backend="gloo")
        else:  # what stays fp32 (the master weights' optimizer maths, norms) on tensor cores
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # type: ignore[untyped-decorator,unused-ignore]
    def init_model(self) -> None:
        """verl's, after writing the fresh fp32 LoRA adapter it is to load when asked to (`FRESH_ADAPTER_ENV`):
        every rank writes the same one (same seed) to a folder of its own, so no node needs another's disk, and
        deletes it once verl has built the model from it."""
        seed = os.environ.get(FRESH_ADAPTER_ENV)
        model = self.config.model
        if seed is None or int(model.get("lora_rank") or 0) <= 0 or model.get("lora_adapter_path"):
            super().init_model()
            return
        from omegaconf import open_dict

        from agl_trainer.verl.adapter import fresh_adapter_folder

        targets = list(model.target_modules)
        with fresh_adapter_folder(
            model.path, rank=int(model.lora_rank), alpha=int(model.lora_alpha), targets=targets, seed=int(seed)
        ) as folder:
            with open_dict(self.config.model):
                self.config.model.lora_adapter_path = str(folder)
            super().init_model()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # type: ignore[untyped-decorator,unused-ignore]
    def parameter_dtypes(self) -> dict[str, list[str]]:
        """The dtypes of the actor's trained and frozen parameters as verl holds them (e.g. a LoRA policy on CUDA:
        trained fp32, frozen bf16)."""
        trained: set[str] = set()
        frozen: set[str] = set()
        for param in self._module().parameters():
            (trained if param.requires_grad else frozen).add(str(param.dtype).removeprefix("torch."))
        return {"trained": sorted(trained), "frozen": sorted(frozen)}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # type: ignore[untyped-decorator,unused-ignore]
    def to(self, device: str, model: bool = True, optimizer: bool = True, grad: bool = True) -> None:
        """verl's own move (`TrainingWorker.to`: "device" or "cpu"), then, leaving the accelerator, every freed
        block handed back to the driver (synchronize, then `empty_cache`): vLLM wakes into that memory next.

        No `reshard()` is needed first, although a forward can leave FSDP2 modules (the root's always, when
        `reshard_after_forward` is off) holding their gathered parameters: verl's offload is `module.to("cpu")`, and
        FSDP2's `FSDPModule._apply`, which that runs on each FSDP module, reshards it (freeing the gathered copies)
        before moving anything. tests/test_verl_offload.py checks it through verl's real offload branch."""
        super().to(device, model=model, optimizer=optimizer, grad=grad)
        accelerator = get_torch_device()
        emptied = device == "cpu"
        if emptied:
            accelerator.synchronize()
            accelerator.empty_cache()
        self._moves.append(
            {
                "device": device,
                "model": model,
                "optimizer": optimizer,
                "grad": grad,
                "emptied_cache": emptied,
                "allocated": int(accelerator.memory_allocated()),
                "reserved": int(accelerator.memory_reserved()),
            }
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # type: ignore[untyped-decorator,unused-ignore]
    def moves(self) -> list[dict[str, Any]]:
        """Every `to` this rank made, in order (what tests and the GPU smoke check read)."""
        return list(self._moves)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # type: ignore[untyped-decorator,unused-ignore]
    def peak_memory(self, reset: bool = False) -> dict[str, int]:
        """This rank's peak memory (bytes) since the start or the last `reset`: on CUDA the caching allocator's
        peaks (`allocated`, `reserved`); on a CPU the process's resident high-water mark (`allocated`, VmHWM, reset
        through /proc/self/clear_refs) and what was resident before the model was loaded (`before_model`)."""
        accelerator = get_torch_device()
        if get_device_name() == "cpu":
            out = {
                "allocated": _proc_status_bytes("VmHWM"),
                "reserved": 0,
                "before_model": self._resident_before_model,
            }
            if reset:
                Path("/proc/self/clear_refs").write_text("5")  # the high-water mark back to what is resident now
            return out
        out = {"allocated": int(accelerator.max_memory_allocated()), "reserved": int(accelerator.max_memory_reserved())}
        if reset:
            accelerator.reset_peak_memory_stats()
        return out

    def _module(self) -> Any:
        assert self.actor is not None, "init_model() first"
        return self.actor.engine.module

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # type: ignore[untyped-decorator,unused-ignore]
    def export_weights(self) -> dict[str, Any] | None:
        """{"lora": bool, "state": {name: tensor}, "peft_config": dict | None} on rank 0 (None elsewhere): every
        rank takes part in gathering the shards."""
        from peft.utils.save_and_load import get_peft_model_state_dict

        module = self._module()
        peft_config = getattr(module, "peft_config", None)
        if peft_config:
            state = get_peft_model_state_dict(module)
            config = peft_config["default"].to_dict()
        else:
            state = module.state_dict()
            config = None
        rank0 = torch.distributed.get_rank() == 0
        full = {}
        for name, tensor in state.items():
            value = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor  # a collective: every rank
            if rank0:  # the other ranks only take part in the gather: a host copy each would be N full models
                full[name] = value.detach().to("cpu", copy=True)
            del value
        if not rank0:
            return None
        if config is not None:
            config = {k: (sorted(v) if isinstance(v, set) else v) for k, v in config.items()}
        return {"lora": config is not None, "state": full, "peft_config": config}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # type: ignore[untyped-decorator,unused-ignore]
    def torch_threads(self) -> int:
        return int(torch.get_num_threads())


def _proc_status_bytes(field: str) -> int:
    """A memory figure of this process from /proc/self/status (kB there), in bytes; 0 where there is none."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
