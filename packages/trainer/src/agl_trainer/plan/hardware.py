"""The machines a plan is for: GPUs per node, nodes, memory per GPU. Described by flags, or read off CUDA."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hardware:
    gpus_per_node: int
    nodes: int = 1
    gpu_memory_gib: float = 80.0
    gpu_name: str | None = None  # what CUDA says, when read off this machine

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    def validate(self) -> None:
        problems = []
        if self.gpus_per_node < 1:
            problems.append(f"--gpus-per-node must be ≥ 1, got {self.gpus_per_node}")
        if self.nodes < 1:
            problems.append(f"--nodes must be ≥ 1, got {self.nodes}")
        if not 1 <= self.gpu_memory_gib <= 4096:
            problems.append(f"--gpu-memory-gib must be between 1 and 4096, got {self.gpu_memory_gib:g}")
        if problems:
            raise ValueError("invalid hardware: " + "; ".join(problems))


def detect() -> Hardware | None:
    """This machine's GPUs as torch's CUDA sees them (one node), or None without CUDA."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return None
    props = torch.cuda.get_device_properties(0)
    return Hardware(
        gpus_per_node=torch.cuda.device_count(),
        nodes=1,
        gpu_memory_gib=round(props.total_memory / 2**30, 1),
        gpu_name=str(props.name),
    )


def resolve(gpus_per_node: int | None, nodes: int | None, gpu_memory_gib: float | None) -> Hardware:
    """The hardware a plan is for: each flag given wins, the rest is read off this machine's CUDA; without CUDA
    and without `--gpus-per-node` there is nothing to plan for."""
    here = detect()
    if gpus_per_node is None and here is None:
        raise ValueError(
            "this machine has no CUDA GPU: describe the one to plan for with --gpus-per-node N (and --nodes M, "
            "--gpu-memory-gib G; 80 by default)"
        )
    hardware = Hardware(
        gpus_per_node=gpus_per_node if gpus_per_node is not None else here.gpus_per_node,  # type: ignore[union-attr]
        nodes=nodes or 1,
        gpu_memory_gib=gpu_memory_gib or (here.gpu_memory_gib if here is not None else 80.0),
        gpu_name=here.gpu_name if here is not None and gpus_per_node is None else None,
    )
    hardware.validate()
    return hardware
