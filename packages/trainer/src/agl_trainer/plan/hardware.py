"""The machines a plan is for: GPUs per node, nodes, memory per GPU. Described by flags, read off the Ray cluster
the run trains on (agl_trainer.plan.cluster), or read off this machine's CUDA."""

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
    # and their Ray node ids, in the same order: where agl starts each node's vLLM server (agl_trainer.engine_fleet)
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


def resolve(gpus_per_node: int | None, nodes: int | None, gpu_memory_gib: float | None) -> Hardware:
    """The hardware a plan is for. `--gpus-per-node` / `--nodes` describe a machine that is not this one: each
    given wins, the rest is read off this machine's CUDA. Without them, the Ray cluster this process joined
    (`agl train --plan --ray-address ADDR` joins it first) when it declares GPUs, read as a run reads it
    (agl_trainer.plan.cluster.from_ray), else this machine's CUDA. `--gpu-memory-gib` wins over what either says.
    Without CUDA, a cluster or `--gpus-per-node` there is nothing to plan for."""
    if gpus_per_node is None and nodes is None:
        from agl_trainer.plan.cluster import from_ray

        cluster = from_ray(None, gpu_memory_gib=gpu_memory_gib)
        if cluster is not None:
            return cluster
    here = detect()
    if gpus_per_node is None and here is None:
        raise ValueError(
            "this machine has no CUDA GPU: describe the one to plan for with --gpus-per-node N (and --nodes M, "
            "--gpu-memory-gib G; 80 by default), or plan for a Ray cluster with --ray-address ADDR"
        )
    hardware = Hardware(
        gpus_per_node=gpus_per_node if gpus_per_node is not None else here.gpus_per_node,  # type: ignore[union-attr]
        nodes=nodes or 1,
        gpu_memory_gib=gpu_memory_gib or (here.gpu_memory_gib if here is not None else 80.0),
        gpu_name=here.gpu_name if here is not None and gpus_per_node is None else None,
    )
    hardware.validate()
    return hardware
