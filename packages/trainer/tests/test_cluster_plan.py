"""A run on a Ray cluster plans for the cluster's nodes, not for this machine (issue #42): two `ray start` nodes on
loopback declaring 4 GPUs each (test_ray_placement's cluster; Ray only counts them), read as 2 nodes × 4 GPUs. A
run asking for 8 trainer ranks fits, the default uses all 8, `agl train --plan --ray-address` prints the plan the
run writes, and 9 ranks are refused naming both nodes. All on the CPU: the run plans because the cluster declares
GPUs, not because this machine has CUDA."""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from rich.console import Console

# the same two-node cluster helpers (they skip this module where Ray or verl is missing)
from test_ray_placement import connected, two_nodes

from agl_trainer.plan.cluster import GPU_MEMORY_GIB, MEMORY_RESOURCE, from_ray, hardware_of
from agl_trainer.plan.hardware import detect

MODEL = Path(__file__).parent / "data" / "models" / "Qwen2.5-1.5B-Instruct"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The address of a head and a second node, each with 2 CPUs and 4 declared GPUs, both joined."""
    with two_nodes(tmp_path_factory.mktemp("ray"), gpus=4) as address:
        with connected(address):  # waits until the second node has joined, then leaves
            pass
        yield address


@pytest.fixture(autouse=True)
def leave_ray() -> Iterator[None]:
    """A run stays joined to its cluster (verl's workers share the connection): each test leaves it."""
    yield
    import ray

    if ray.is_initialized():
        ray.shutdown()


def config(tmp_path: Path, **options: Any) -> Any:
    from agl_trainer.options import build_config

    base = {
        "model": str(MODEL),
        "train_tasks": [{"q": 1}],
        "eval_tasks": [{"q": 1}],
        "run_dir": tmp_path / "run",
        "trainer": "verl",
        "checkpoint_dir": str(tmp_path / "shared"),
    }
    return build_config("m:f", {**base, **options})


def run_plan(cfg: Any) -> Any:
    """The run's own planning step (what TrainingRun._start calls)."""
    from agl_trainer.run.setup import gpu_plan

    return gpu_plan(cfg, cfg.run_dir, Console(file=io.StringIO()))


def test_the_cluster_is_read_as_its_nodes_and_gpus(cluster: str) -> None:
    hardware = from_ray(cluster)
    assert hardware is not None
    assert (hardware.nodes, hardware.gpus_per_node, hardware.gpus) == (2, 4, 8)
    assert len(set(hardware.node_names)) == 2 and all(" (node " in n for n in hardware.node_names)
    # declared GPUs of no type: this machine's CUDA when it has some, else 80 GiB assumed (and said)
    here = detect()
    expected = (80.0, "assumed") if here is None else (here.gpu_memory_gib, f"this machine's CUDA ({here.gpu_name})")
    assert (hardware.gpu_memory_gib, hardware.gpu_memory_from) == expected
    # --gpu-memory-gib wins over what the cluster says (the cluster this process joined: address None)
    flagged = dataclasses.replace(hardware, gpu_memory_gib=40.0, gpu_memory_from="--gpu-memory-gib")
    assert from_ray(None, gpu_memory_gib=40) == flagged


def test_a_run_over_both_nodes_fits_by_default_and_its_plan_is_the_clis(cluster: str, tmp_path: Path) -> None:
    # eight ranks over two nodes of four: refused before (this machine's CUDA, one node), planned [4, 4] now
    explicit = config(tmp_path, trainer_workers=8, ray_address=cluster)
    planned = run_plan(explicit)
    assert planned is not None and planned.fits and planned.layout.trainer_gpus_per_node == [4, 4]
    # unset, trainer_workers is every GPU the plan gives the trainer, and nothing warns of idle GPUs
    auto = config(tmp_path / "auto", ray_address=cluster, engine="vllm")
    assert auto.trainer_workers is None
    planned = run_plan(auto)
    assert planned is not None and planned.layout.trainer_gpus_per_node == [4, 4] and auto.trainer_workers == 8
    written = json.loads((auto.run_dir / "plan.json").read_text())
    assert written["run"]["trainer_workers"] == 8 and written["placement"]["vllm"]["servers_per_node"] == 4
    assert len(written["vllm"]) == 8  # LoRA: a vLLM server per GPU of each node
    assert not any("idle during updates" in w["message"] for w in written["warnings"])
    assert written["hardware"]["nodes"] == 2 and written["hardware"]["gpus_per_node"] == 4
    # vLLM keeping one GPU of each node: the trainer has the other three of each
    split = config(tmp_path / "split", ray_address=cluster, engine="vllm", rollout_gpus=1)
    assert run_plan(split).layout.trainer_gpus_per_node == [3, 3] and split.trainer_workers == 6


def test_agl_train_plan_with_ray_address_prints_the_runs_plan(cluster: str, tmp_path: Path) -> None:
    from agl_trainer.cli import train

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"q": 1}\n')
    run_dir = tmp_path / "run"
    args = ["m:f", "--tasks", str(tasks), "--eval-tasks", str(tasks), "--model", str(MODEL), "--run-dir", str(run_dir)]
    args += [
        "--trainer",
        "verl",
        "--engine",
        "vllm",
        "--ray-address",
        cluster,
        "--checkpoint-dir",
        str(tmp_path / "shared"),
    ]
    printed = CliRunner().invoke(train, [*args, "--plan"])
    assert printed.exit_code == 0, printed.output
    import ray

    assert not ray.is_initialized()  # --plan joined the cluster to read it, and left
    # the run, with the same options: the same plan, written to the run directory
    run_plan(config(tmp_path, ray_address=cluster, engine="vllm", run_dir=run_dir))
    assert json.loads(printed.stdout) == json.loads((run_dir / "plan.json").read_text())
    # --gpus-per-node / --nodes describe another machine: the cluster is not read
    other = CliRunner().invoke(train, [*args, "--plan", "--gpus-per-node", "8", "--nodes", "3"])
    assert other.exit_code == 0, other.output
    assert json.loads(other.stdout)["placement"]["gpus_per_node"] == [8, 8, 8]


def test_more_ranks_than_the_cluster_has_are_refused_naming_its_nodes(cluster: str, tmp_path: Path) -> None:
    hardware = from_ray(cluster)
    assert hardware is not None
    with pytest.raises(ValueError, match=r"--trainer-workers 9 is more than the 8 GPU") as refused:
        run_plan(config(tmp_path, trainer_workers=9, ray_address=cluster))
    assert all(name in str(refused.value) for name in hardware.node_names)


# ------------------------------------------------------------------- what ray.nodes() says, without a cluster


def node(ip: str, node_id: str, gpus: float, **resources: float) -> dict[str, Any]:
    return {
        "Alive": True,
        "NodeID": node_id,
        "NodeManagerAddress": ip,
        "Resources": {"CPU": 8.0, "GPU": gpus, **resources},
    }


def test_cpu_and_dead_nodes_are_left_out_and_unequal_gpu_nodes_refused() -> None:
    head = {**node("10.0.0.1", "aaaa0000", 0)}
    dead = {**node("10.0.0.9", "dddd0000", 8), "Alive": False}
    h100 = {"accelerator_type:H100": 1.0}
    two = hardware_of([head, node("10.0.0.2", "bbbb0000", 8, **h100), node("10.0.0.3", "cccc0000", 8, **h100), dead])
    assert two is not None and (two.nodes, two.gpus_per_node, two.gpu_name) == (2, 8, "H100")
    assert two.node_names == ("10.0.0.2 (node bbbb0000)", "10.0.0.3 (node cccc0000)")
    assert hardware_of([head]) is None  # no GPU anywhere: nothing to plan for
    with pytest.raises(
        ValueError, match=r"unequal GPUs.*10\.0\.0\.2 \(node bbbb0000\): 8.*10\.0\.0\.3 \(node cccc0000\): 4"
    ):
        hardware_of([node("10.0.0.2", "bbbb0000", 8), node("10.0.0.3", "cccc0000", 4)])


def test_gpu_memory_comes_from_the_nodes_resource_then_their_accelerator_type(monkeypatch: pytest.MonkeyPatch) -> None:
    import agl_trainer.plan.cluster as cluster_module

    monkeypatch.setattr(cluster_module, "detect", lambda: None)  # a driver without CUDA (a CPU head node)
    declared = hardware_of([node("10.0.0.2", "b", 4, **{MEMORY_RESOURCE: 141.0, "accelerator_type:H200": 1.0})])
    assert declared is not None and (declared.gpu_memory_gib, declared.gpu_memory_from) == (
        141.0,
        f"the nodes' {MEMORY_RESOURCE} resource",
    )
    typed = hardware_of([node("10.0.0.2", "b", 4, **{"accelerator_type:L4": 1.0})])
    assert typed is not None and typed.gpu_memory_gib == GPU_MEMORY_GIB["L4"] and "L4" in str(typed.gpu_memory_from)
    unknown = hardware_of([node("10.0.0.2", "b", 4, **{"accelerator_type:X9": 1.0})])
    assert unknown is not None and (unknown.gpu_memory_gib, unknown.gpu_memory_from) == (80.0, "assumed")
    assert hardware_of([node("10.0.0.2", "b", 4)], gpu_memory_gib=24).gpu_memory_gib == 24.0  # type: ignore[union-attr]


def test_without_a_plan_trainer_workers_is_one(tmp_path: Path) -> None:
    cpu = config(tmp_path, device="cpu")
    assert run_plan(cpu) is None and cpu.trainer_workers == 1
    explicit = config(tmp_path, device="cpu", trainer_workers=2)
    assert run_plan(explicit) is None and explicit.trainer_workers == 2
    with pytest.raises(ValueError, match="trainer_workers must be ≥ 1"):
        config(tmp_path, trainer_workers=0).validate()
