"""The trainer's ranks on a Ray cluster of two nodes: two `ray start` processes on loopback, the second joining the
first, each declaring GPUs it does not have (Ray only places by them). One placement group per node lands each on
its own node; a pool larger than a node fails within its deadline, naming the cluster, instead of waiting for ever;
verl's actor worker runs one rank on each node (on the CPU) and updates."""

from __future__ import annotations

import copy
import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agl_trainer.plan.hardware import Hardware
from agl_trainer.plan.layout import trainer_placement

pytestmark = pytest.mark.slow

if importlib.util.find_spec("ray") is None or importlib.util.find_spec("verl") is None:
    pytest.skip('Ray and verl are not installed (pip install "agl-trainer[verl]")', allow_module_level=True)

# the two-node cluster helpers, shared with the other several-nodes tests and the benchmarks
from agl.testing.ray_cluster import ENV as ENV  # noqa: E402
from agl.testing.ray_cluster import connected as connected  # noqa: E402
from agl.testing.ray_cluster import two_nodes as two_nodes  # noqa: E402


def test_one_group_per_node_and_a_pool_larger_than_a_node_fails_in_time(tmp_path: Path) -> None:
    from ray.util.placement_group import placement_group_table, remove_placement_group

    from agl_trainer.verl.placement import reserve

    placement = trainer_placement(4, Hardware(gpus_per_node=2, nodes=2), 2)
    assert placement == [2, 2]  # what the plan asks Ray for on this cluster
    with two_nodes(tmp_path) as address, connected(address):
        groups = reserve(placement, gpu_resource="GPU", timeout_s=60)
        nodes = []
        for group in groups:
            bundle_nodes = set(placement_group_table(group)["bundles_to_node_id"].values())
            assert len(bundle_nodes) == 1  # a node's ranks together (STRICT_PACK)
            nodes.append(bundle_nodes.pop())
        assert len(set(nodes)) == 2  # and each node's group on its own node
        for group in groups:
            remove_placement_group(group)
        # four GPUs on one node: no node has them; an error within the deadline, not a hang
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match=r"asked for \[4\] ranks per node.*2 node\(s\).*2 GPU"):
            reserve([4], gpu_resource="GPU", timeout_s=5)
        assert time.monotonic() - t0 < 20


def test_verl_runs_one_rank_on_each_node(tmp_path: Path, tiny_model_dir: Path) -> None:
    """In a driver process of its own, as `agl train --ray-address` is: a process that ran a local Ray before (other
    test modules do) has its actors on a joined cluster cancelled as soon as they are created (Ray 2.60)."""
    import json

    with two_nodes(tmp_path, gpus=0) as address:
        code = (
            f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import test_ray_placement as t; "
            f"t.two_node_update({address!r}, {str(tiny_model_dir)!r})"
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=ENV)
        assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["tokens"] > 0 and result["grad_norm"] > 0
    assert result["moved"] > 1e-4  # the update changed the log-probs on both ranks' shared model


def two_node_update(address: str, model_dir: str) -> None:
    """The driver's side of the test above: verl's actor with a rank on each node, one update; prints JSON."""
    import json

    from test_verl_policy import fixed_batch

    from agl_trainer.config import PolicyConfig
    from agl_trainer.models import load_model
    from agl_trainer.policy.trainer import PolicyTrainer, wrap_lora
    from agl_trainer.verl.backend import VerlPolicy

    cfg = PolicyConfig(lr=1e-2)
    with connected(address):
        model, tokenizer = load_model(model_dir, device="cpu")
        twin = PolicyTrainer(wrap_lora(model, cfg), cfg, pad_id=tokenizer.pad_token_id)
        batch = fixed_batch(twin)
        with VerlPolicy(model_dir, cfg, workers=2, ray_address=address, placement=[1, 1], device="cpu") as policy:
            before = policy.logprobs(batch)
            stats = policy.update(copy.deepcopy(batch))
            after = policy.logprobs(batch)
    moved = max(abs(a - b) for x, y in zip(before, after, strict=True) for a, b in zip(x, y, strict=True))
    print(json.dumps({"tokens": stats.tokens, "grad_norm": stats.grad_norm, "moved": moved}))
