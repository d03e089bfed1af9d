"""The Ray cluster a run trains on, as the `Hardware` its plan is for.

With `--ray-address` (or a Ray this process already joined) verl's ranks go wherever that cluster has GPUs, so
the plan is made from the cluster, not from this machine's CUDA (which is one node, and may be none: a driver on a
CPU head node). `ray.nodes()` gives each alive node's declared resources:

- **nodes and GPUs per node**: the nodes that declare GPUs (CPU-only nodes, a head node without GPUs, are left out).
  Every GPU node must declare the same number: verl's pools and agl's layout are `[gpus_per_node] × nodes`. Nodes
  with unequal counts are refused, naming each node and its count, rather than planned on the smallest (which would
  leave GPUs idle without saying so): give each node the same `ray start --num-gpus N`.
- **memory per GPU**, which Ray does not report, from the first of: the `--gpu-memory-gib` flag (`--plan` only);
  the `agl_gpu_memory_gib` custom resource the nodes declare (`ray start --resources='{"agl_gpu_memory_gib": 80}'`,
  GiB per GPU; the smallest over the nodes); this machine's CUDA when it has some and its GPU is the nodes'
  `accelerator_type` (or they name none); the `accelerator_type` Ray detects on NVIDIA nodes, from the table below;
  else 80 GiB, assumed, and said so (`gpu_memory_from: "assumed"`, printed by the run).

A run and `agl train --plan --ray-address ADDR` read the cluster with the same function (`from_ray`), so they plan
the same. Reading joins the cluster the way `VerlPolicy` joins it (`ray.init(address=…)` with the same runtime
environment), never starting one, and a run stays joined: VerlPolicy then shares that connection.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from agl_trainer.plan.hardware import Hardware, detect

MEMORY_RESOURCE = "agl_gpu_memory_gib"
ACCELERATOR_PREFIX = "accelerator_type:"
ASSUMED_GIB = 80.0
# GiB per GPU about as CUDA reports it (a little under the board's GB), by the name Ray's accelerator_type gives.
# One name for several boards gets the smallest: Ray calls 40 GB and 80 GB A100s both "A100" (declare
# agl_gpu_memory_gib on 80 GB ones, or run the driver on one of the nodes).
GPU_MEMORY_GIB: dict[str, float] = {
    "B200": 178.0,
    "H200": 139.0,
    "H100": 79.0,
    "H20": 95.0,
    "A100": 39.0,
    "A100-40G": 39.0,
    "A100-80G": 79.0,
    "L40S": 44.0,
    "A10G": 22.0,
    "L4": 22.0,
    "V100": 15.5,
    "T4": 14.5,
}
# what VerlPolicy._start_ray passes when it joins a cluster (agl_trainer/verl/backend.py): a run joined here keeps
# the connection for verl's workers, so the two must agree
RUNTIME_ENV = {"env_vars": {"TOKENIZERS_PARALLELISM": "false"}}


def joined_ray() -> bool:
    """Whether this process has joined a Ray cluster (without importing Ray when nothing has)."""
    ray = sys.modules.get("ray")
    return bool(ray is not None and ray.is_initialized())


def connect(address: str) -> bool:
    """Join the Ray cluster at `address` as VerlPolicy does (never starting one); whether this call joined it (False:
    this process already had)."""
    import ray

    if ray.is_initialized():
        return False
    try:
        # the workers' logs reach this process: an NCCL error on another node is otherwise invisible
        ray.init(address=address, runtime_env=RUNTIME_ENV, log_to_driver=True)
    except ConnectionError as exc:
        raise ValueError(f"cannot join the Ray cluster at --ray-address {address}: {exc}") from exc
    return True


@contextmanager
def joined(address: str | None) -> Iterator[None]:
    """The cluster at `address` joined for as long as this lasts, then left if this joined it (`--plan`, tests);
    nothing without an address."""
    mine = connect(address) if address else False
    try:
        yield
    finally:
        if mine:
            import ray

            ray.shutdown()


def from_ray(address: str | None, *, gpu_memory_gib: float | None = None) -> Hardware | None:
    """The cluster at `address` (joined first unless this process has joined one, and left joined), or the one
    this process joined when `address` is None; None: no cluster, or no node of it declares a GPU."""
    if not joined_ray():
        if not address:
            return None
        connect(address)
    import ray

    return hardware_of(ray.nodes(), gpu_memory_gib=gpu_memory_gib)


def node_name(node: Mapping[str, Any]) -> str:
    """A node as messages name it: its address and the start of its id (two nodes may share an address)."""
    return f"{node.get('NodeManagerAddress', '?')} (node {str(node.get('NodeID', '?'))[:8]})"


def hardware_of(nodes: Sequence[Mapping[str, Any]], *, gpu_memory_gib: float | None = None) -> Hardware | None:
    """The `Hardware` of `ray.nodes()`' alive GPU nodes (the module's docstring says how); None without any."""
    gpu_nodes = [n for n in nodes if n.get("Alive", True) and int(n.get("Resources", {}).get("GPU", 0)) > 0]
    if not gpu_nodes:
        return None
    counts = {node_name(n): int(n["Resources"]["GPU"]) for n in gpu_nodes}
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"{name}: {gpus} GPU(s)" for name, gpus in counts.items())
        raise ValueError(
            f"the Ray cluster's nodes declare unequal GPUs ({listed}); agl plans the same GPUs on every node (verl's "
            "pools are GPUs-per-node × nodes): start each node's Ray with the same --num-gpus N (CUDA_VISIBLE_DEVICES "
            "to leave some out)"
        )
    types = sorted({_accelerator(n) or "" for n in gpu_nodes})
    named = [t for t in types if t]
    memory, source = _memory(gpu_nodes, named, gpu_memory_gib)
    hardware = Hardware(
        gpus_per_node=next(iter(counts.values())),
        nodes=len(gpu_nodes),
        gpu_memory_gib=memory,
        gpu_name="/".join(named) or None,
        node_names=tuple(counts),
        gpu_memory_from=source,
        node_ids=tuple(str(n.get("NodeID", "")) for n in gpu_nodes),
    )
    hardware.validate()
    return hardware


def _accelerator(node: Mapping[str, Any]) -> str | None:
    for key in node.get("Resources", {}):
        if str(key).startswith(ACCELERATOR_PREFIX):
            return str(key)[len(ACCELERATOR_PREFIX) :]
    return None


def _memory(gpu_nodes: Sequence[Mapping[str, Any]], named: list[str], flag: float | None) -> tuple[float, str]:
    """GiB per GPU and where it came from: the flag, the nodes' resource, this machine's CUDA, the table, or 80."""
    if flag:
        return float(flag), "--gpu-memory-gib"
    declared = [n["Resources"].get(MEMORY_RESOURCE) for n in gpu_nodes]
    if all(d is not None for d in declared):
        return float(min(declared)), f"the nodes' {MEMORY_RESOURCE} resource"
    here = detect()
    if here is not None and (not named or all(_same_gpu(t, here.gpu_name) for t in named)):
        return here.gpu_memory_gib, f"this machine's CUDA ({here.gpu_name})"
    known = [GPU_MEMORY_GIB[t] for t in named if t in GPU_MEMORY_GIB]
    if named and len(known) == len(named):
        return min(known), f"Ray's accelerator_type {'/'.join(named)}"
    return ASSUMED_GIB, "assumed"


def _same_gpu(accelerator: str, cuda_name: str | None) -> bool:
    """Whether CUDA's name ("NVIDIA H100 80GB HBM3") is the board Ray calls `accelerator` ("H100")."""
    base = accelerator.split("-")[0].upper()
    return cuda_name is not None and base in cuda_name.upper().replace("-", " ").split()
