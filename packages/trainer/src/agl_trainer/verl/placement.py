"""The trainer's ranks on Ray's nodes: one placement group per node, reserved with a deadline.

verl asks Ray for one STRICT_PACK placement group per entry of its pool (`[gpus_per_node] * nodes` in its own
trainer) and waits for them without a timeout: a pool larger than a node, or a cluster with fewer GPUs than
asked, hangs the run for good. agl reserves the same groups itself, waits at most `timeout_s`, and otherwise
says what the cluster has and what was asked.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

PLACEMENT_TIMEOUT_S = 120.0


def bundles(ranks_per_node: Sequence[int], *, gpu_resource: str | None) -> list[list[dict[str, float]]]:
    """What each node's group asks for: one CPU per rank (verl's default, 10, starves a CPU node) and one GPU."""
    bundle: dict[str, float] = {"CPU": 1.0}
    if gpu_resource is not None:
        bundle[gpu_resource] = 1.0
    return [[dict(bundle) for _ in range(n)] for n in ranks_per_node]


def cluster_summary() -> str:
    """The alive nodes of the Ray cluster this process joined, with their CPUs and GPUs."""
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    parts = []
    for node in nodes:
        res = node.get("Resources", {})
        parts.append(f"{node.get('NodeManagerAddress')}: {res.get('CPU', 0):g} CPU, {res.get('GPU', 0):g} GPU")
    return f"{len(nodes)} node(s) ({'; '.join(parts)})"


def reserve(
    ranks_per_node: Sequence[int], *, gpu_resource: str | None, timeout_s: float = PLACEMENT_TIMEOUT_S
) -> list[Any]:
    """One STRICT_PACK placement group per entry, ready within `timeout_s`; else they are removed and a
    RuntimeError names the cluster's nodes and what was asked."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    groups = [
        placement_group(bundles=b, strategy="STRICT_PACK") for b in bundles(ranks_per_node, gpu_resource=gpu_resource)
    ]
    ready, _ = ray.wait([g.ready() for g in groups], num_returns=len(groups), timeout=timeout_s)
    if len(ready) < len(groups):
        for group in groups:
            remove_placement_group(group)
        unit = f"{gpu_resource} and 1 CPU" if gpu_resource else "1 CPU"
        raise RuntimeError(
            f"Ray could not place the trainer's ranks within {timeout_s:g} s: asked for {list(ranks_per_node)} ranks "
            f"per node (each rank {unit}, each node's ranks on one node), the cluster has {cluster_summary()}. "
            "Give --trainer-workers at most the GPUs of its nodes, ranks per node at most a node's GPUs "
            "(agl train --plan shows the placement), or add nodes"
        )
    return groups


# the GPUs of each node that vLLM holds in the split layout, for the trainer's ranks to check theirs against
VLLM_GPUS_ENV = "AGL_VLLM_GPUS"


def gpu_clash(assigned: Sequence[int | str], vllm_gpus: Sequence[int], node: str) -> str | None:
    """Why a trainer rank given `assigned` GPUs by Ray must not run, or None. On a cluster the user started, Ray
    knows nothing of the vLLM servers beside it: unless each node's Ray sees only the trainer's GPUs, it may hand a
    rank a GPU vLLM is using, and both run out of memory mid-run."""
    clash = sorted({int(g) for g in assigned} & set(vllm_gpus))
    if not clash:
        return None
    keep = ",".join(str(i) for i in range(min(vllm_gpus)))
    return (
        f"a trainer rank on {node} was given GPU(s) {clash} by Ray, which vLLM holds in the split layout (GPUs"
        f" {sorted(vllm_gpus)} of each node): start each node's Ray with only the trainer's GPUs visible, e.g."
        f" CUDA_VISIBLE_DEVICES={keep} ray start ... --num-gpus {min(vllm_gpus)}, and vLLM on the others"
    )
