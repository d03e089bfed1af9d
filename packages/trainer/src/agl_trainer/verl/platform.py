"""verl's platform for machines without an accelerator: the CPU, with gloo between ranks.

verl 0.9 ships platforms for CUDA, ROCm and Ascend only, and on a machine with none of them falls back to CUDA and
dies in NCCL. verl imports the modules named in `VERL_USE_EXTERNAL_MODULES` when it is imported itself, and picks
the platform named in `VERL_PLATFORM`; `agl_trainer.verl.backend` sets both in its Ray workers
(`VERL_USE_EXTERNAL_MODULES=agl_trainer.verl.platform`, `VERL_PLATFORM=agl-cpu`). Importing this module only
registers the platform; nothing else changes.

What the CPU needs from verl beyond this class, and where agl does it:
- tensors stay on the CPU, so the "current device" is the string ``"cpu"``: verl moves tensors with
  ``.to(get_device_id())``, where an int 0 would mean ``cuda:0``;
- verl registers its FSDP engines for the devices cuda and npu only: ``VERL_ENGINE_DEVICE=cuda`` picks the FSDP
  engine class, while the tensors still go where this platform says;
- verl's process-group set-up asks for ``cpu:gloo,<device>:<ccl>``, which torch refuses when the device is the CPU
  too: `agl_trainer.verl.worker` starts the process group with plain ``gloo`` first;
- its resource pools ask Ray for ``max_colocate_count`` CPUs per worker (10 by default) and wait for ever on a
  small machine: agl asks for one;
- verl's FLOPs counter asks the device module for its name: ``"CPU"``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import ModuleType, SimpleNamespace
from typing import Any

import psutil
import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

from agl_trainer.verl import PLATFORM_NAME as NAME


def _zero(*_: Any, **__: Any) -> int:
    return 0


def _nothing(*_: Any, **__: Any) -> None:
    return None


def _memory_info(*_: Any) -> tuple[int, int]:
    memory = psutil.virtual_memory()
    return int(memory.available), int(memory.total)


def _device_module() -> ModuleType:
    """What verl calls on `torch.cuda`, answered for the CPU (memory counters read 0: the CPU allocator keeps none).
    A module object, since verl's type says `ModuleType`."""
    module = ModuleType("agl_cpu_device")
    namespace = SimpleNamespace(
        is_available=lambda: True,
        is_initialized=lambda: True,
        current_device=lambda: "cpu",
        device_count=lambda: 1,
        set_device=_nothing,
        synchronize=_nothing,
        empty_cache=_nothing,
        ipc_collect=_nothing,
        set_per_process_memory_fraction=_nothing,
        memory_allocated=_zero,
        max_memory_allocated=_zero,
        memory_reserved=_zero,
        max_memory_reserved=_zero,
        reset_peak_memory_stats=_nothing,
        mem_get_info=_memory_info,
        get_device_name=lambda *_: "CPU",
        get_rng_state=lambda *_: torch.get_rng_state(),
        set_rng_state=lambda state, *_: torch.set_rng_state(state),
        manual_seed=torch.manual_seed,
        manual_seed_all=torch.manual_seed,
        Stream=torch.cpu.Stream,
        Event=torch.cpu.Event,
        stream=torch.cpu.stream,
        current_stream=torch.cpu.current_stream,
    )
    module.__dict__.update(vars(namespace))
    return module


@PlatformRegistry.register(platform=NAME)
class PlatformCPU(PlatformBase):  # type: ignore[misc]
    """The CPU as verl's device: fp32, gloo, no streams, no profiler."""

    _module = _device_module()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return self._module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # verl probes its own platforms first; when none answered, the CPU is the right fallback
        return True

    def current_device(self) -> Any:
        return "cpu"  # tensors are moved with .to(current_device()): an int would mean cuda:N

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "AGL_VERL_VISIBLE_CPUS"  # nothing to hide: a name no one sets

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {}  # the placement-group bundle already holds the worker's CPU

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
