"""What verl needs on the driver's side to run on a CPU: the environment its workers start with (agl's platform
module, `agl_trainer.verl.platform`, loaded by verl in each worker), the platform chosen in the driver, and
micro-batches small enough for a CPU's memory. On CUDA none of this is used."""

from __future__ import annotations

import importlib
import os

from agl_trainer.verl import PLATFORM_NAME

PLATFORM_MODULE = "agl_trainer.verl.platform"


def cpu_worker_env() -> dict[str, str]:
    """What verl needs in each worker process (and the driver) to run on the CPU."""
    return {
        "VERL_USE_EXTERNAL_MODULES": PLATFORM_MODULE,
        "VERL_PLATFORM": PLATFORM_NAME,
        "VERL_ENGINE_DEVICE": "cuda",  # picks verl's FSDP engine class (registered for cuda/npu); tensors stay on cpu
    }


# verl's actor computes vocabulary-sized logits, their log-softmax and the gradients of both at every position of
# a micro-batch; agl's own trainer does so at response positions only. At agl's token budget (16k tokens) a
# 49k-vocabulary model took 14.5 GB in one update on this CPU machine and Ray killed the worker. On a CPU the
# micro-batches verl forms are therefore held to what keeps those float32 tensors within this many bytes (never
# below the longest sequence, which verl cannot split); on CUDA the configured budget is used as it is.
CPU_LOGITS_BYTES = 2 * 2**30
_LOGIT_TENSORS = 4  # logits, log-softmax, and a gradient of each


def cpu_micro_batch_tokens(configured: int, vocab_size: int, longest: int) -> int:
    """verl's token budget per micro-batch on a CPU: `configured`, lowered to fit CPU_LOGITS_BYTES."""
    fits = CPU_LOGITS_BYTES // (max(vocab_size, 1) * 4 * _LOGIT_TENSORS)
    return max(min(configured, fits), longest)


def select_cpu_platform_here() -> None:
    """The driver asks verl's platform for Ray resource names: make it the CPU's, even if verl was imported
    (and its platform chosen) before."""
    os.environ.update(cpu_worker_env())
    importlib.import_module(PLATFORM_MODULE)  # registers it, as verl's import would have
    from verl.plugin.platform import platform_manager

    current = platform_manager._current_platform
    if current is None or current.device_name != "cpu":
        platform_manager.set_platform(platform_manager._create_platform(PLATFORM_NAME))
