"""Where things run on the GPUs: the trainer's ranks per node, and vLLM's GPUs, parallelism and memory share.

Two layouts, as verl and agent-lightning run them:

- **colocated** (the default): vLLM and the trainer share every GPU. vLLM runs in sleep mode: awake during
  rollouts (the trainer's weights and optimizer moved to host memory), asleep during the update (its weights
  offloaded, its KV cache freed). Every GPU works in both phases.
- **split** (`--rollout-gpus K`): vLLM keeps K GPUs of each node for itself, the trainer has the rest; nothing
  sleeps or moves, and the two phases could overlap, but each phase leaves some GPUs idle.

The trainer's ranks fill nodes in order (`[gpus_per_node] * nodes`, as verl builds its pools): a pool larger than
one node would be one placement group Ray can never schedule.
"""

from __future__ import annotations

from dataclasses import dataclass

from agl_trainer.model_shape import ModelShape
from agl_trainer.plan.hardware import Hardware
from agl_trainer.plan.memory import CUDA_CONTEXT_GIB, vllm_memory

COLOCATED_UTILIZATION = 0.85  # vLLM's share while awake, with the trainer's state in host memory
SPLIT_UTILIZATION = 0.90  # on GPUs of its own


@dataclass(frozen=True)
class VllmLayout:
    nodes: int  # one server per node
    gpus_per_server: int
    tensor_parallel: int
    data_parallel: int
    utilization: float
    memory: dict[str, float]  # per GPU (agl_trainer.plan.memory.vllm_memory)
    gpus_per_node: int = 0  # the node's GPUs: in the split layout vLLM holds the last `gpus_per_server` of them

    @property
    def split_gpu_ids(self) -> tuple[int, ...]:
        """The GPUs vLLM holds on each node in the split layout: the last ones (the trainer's are the first)."""
        return tuple(range(self.gpus_per_node - self.gpus_per_server, self.gpus_per_node))


@dataclass(frozen=True)
class Layout:
    mode: str  # "colocated" | "split"
    why: str
    trainer_gpus_per_node: list[int]  # the trainer's ranks on each node (verl's process_on_nodes)
    vllm: VllmLayout | None


def trainer_placement(ranks: int, hardware: Hardware, per_node: int) -> list[int]:
    """The trainer's ranks on each node, filling nodes in order, `per_node` at most on one."""
    if ranks > per_node * hardware.nodes:
        raise ValueError(
            f"--trainer-workers {ranks} is more than the {per_node * hardware.nodes} GPU(s) the trainer can have "
            f"({per_node} per node × {hardware.nodes} node(s))"
        )
    out = []
    left = ranks
    while left > 0:
        out.append(min(per_node, left))
        left -= out[-1]
    return out


def vllm_layout(shape: ModelShape, hardware: Hardware, gpus: int, utilization: float, max_model_len: int) -> VllmLayout:
    """vLLM on `gpus` GPUs of each node: the smallest tensor-parallel size whose weights leave room for a KV cache
    of at least 4 sequences of `max_model_len` tokens, data-parallel over the rest."""
    tp = 1
    while True:
        memory = vllm_memory(shape, gpu_memory_gib=hardware.gpu_memory_gib, utilization=utilization, tensor_parallel=tp)
        if memory["kv_tokens"] >= 4 * max_model_len or tp * 2 > gpus:
            break
        tp *= 2
    return VllmLayout(hardware.nodes, gpus, tp, max(1, gpus // tp), utilization, memory, hardware.gpus_per_node)


def choose_layout(
    shape: ModelShape,
    hardware: Hardware,
    *,
    ranks: int,
    rollout_gpus: int | None,
    max_model_len: int,
    vllm: bool,
) -> Layout:
    """The layout of a run with `ranks` trainer ranks, vLLM (when `vllm`) and `rollout_gpus` (None: colocated)."""
    n = hardware.gpus_per_node
    if rollout_gpus:
        if not vllm:
            raise ValueError("--rollout-gpus gives GPUs to vLLM: use it with --engine vllm")
        if not 0 < rollout_gpus < n:
            raise ValueError(
                f"--rollout-gpus {rollout_gpus} must leave the trainer GPUs on a node of {n}: give 1 to {n - 1}"
            )
        placement = trainer_placement(ranks, hardware, n - rollout_gpus)
        layout = vllm_layout(shape, hardware, rollout_gpus, SPLIT_UTILIZATION, max_model_len)
        why = f"--rollout-gpus {rollout_gpus}: vLLM on {rollout_gpus} GPU(s) of each node, the trainer on the rest"
        return Layout("split", why, placement, layout)
    placement = trainer_placement(ranks, hardware, n)
    if not vllm:
        return Layout("colocated", "one process generates and trains (agl's embedded engine)", placement, None)
    # the trainer's state is in host memory while vLLM is awake; what stays is its CUDA context
    utilization = min(COLOCATED_UTILIZATION, 1 - (CUDA_CONTEXT_GIB + 1.0) / hardware.gpu_memory_gib)
    layout = vllm_layout(shape, hardware, n, round(utilization, 2), max_model_len)
    why = (
        "vLLM and the trainer share every GPU: vLLM sleeps during updates and the trainer's state moves to host "
        "memory during rollouts, so every GPU works in both phases (--rollout-gpus K gives vLLM GPUs of its own)"
    )
    return Layout("colocated", why, placement, layout)
