"""The machines a plan is for: GPUs per node, nodes, memory per GPU. Described by flags, read off the Ray cluster
the run trains on (agl_trainer.plan.cluster), or read off this machine's CUDA (`detect`); which of them a plan is
for, `agl_trainer.plan.cli.resolve` decides."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hardware:
    gpus_per_node: int
    nodes: int = 1
    gpu_memory_gib: float = 80.0
    gpu_name: str | None = None  # what CUDA says, when read off this machine (Ray's accelerator type on a cluster)
    # read off a Ray cluster: its GPU nodes as "<ip> (node <id>)", and where the memory per GPU came from
    node_names: tuple[str, ...] = ()
    gpu_memory_from: str | None = None
    # and their Ray node ids, in the same order: where agl starts each node's vLLM server (agl_trainer.engines.fleet)
    node_ids: tuple[str, ...] = ()

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    def describe_nodes(self) -> str:
        """The nodes, named when read off a cluster: for messages."""
        names = f": {', '.join(self.node_names)}" if self.node_names else ""
        return f"{self.nodes} node(s) of {self.gpus_per_node} GPU(s){names}"

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
