"""The plan's memory model on several nodes and its margin (issue #54): verl shards each layer within a node
(HSDP: `fsdp_size` = a node's ranks, replicated across nodes), so a rank of 2 nodes × 8 holds what a rank of one
node of 8 holds; FSDP2's gathered compute copies exist at one rank too; and every plan keeps a stated headroom
below the usable memory until a GPU measurement replaces it."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agl_trainer.model_shape import read_shape
from agl_trainer.options import build_config
from agl_trainer.plan.build import DEFAULT_HEADROOM_GIB, PlanRequest, fill_limit, make_plan
from agl_trainer.plan.hardware import Hardware
from agl_trainer.plan.memory import UpdateSetup, update_memory

MODELS = Path(__file__).parent / "data" / "models"
EIGHT = Hardware(8, 1, 80.0)
TWO_NODES = Hardware(8, 2, 80.0)
STATE = ("weights", "gradients", "optimizer")


def request(model: str, hardware: Hardware, tmp_path: Path, *, overrides: Any = None, **options: Any) -> PlanRequest:
    cluster = {"ray_address": "auto", "checkpoint_dir": str(tmp_path / "shared")} if hardware.nodes > 1 else {}
    values = {
        "model": str(MODELS / model),
        "train_tasks": [{"q": 1}],
        "eval_tasks": [{"q": 1}],
        "run_dir": tmp_path / "run",
        "trainer": "verl",
        "engine": "vllm",
        "trainer_workers": hardware.gpus,
        **cluster,
        **options,
    }
    config = build_config("agl_trainer.examples.calculator:solve", values)
    return PlanRequest(config, hardware, flash_attention=True, verl_overrides=overrides or {})


@pytest.mark.parametrize("full", [True, False], ids=["full", "lora"])
def test_two_nodes_of_8_hold_per_gpu_what_one_node_of_8_holds(full: bool, tmp_path: Path) -> None:
    """The state is sharded over a node's 8 ranks, not over all 16: the same per-GPU weights, gradients and moments,
    so the same token budget and the same update as on one node."""
    options = {"full_finetune": True} if full else {}
    one = make_plan(request("Qwen2.5-7B-Instruct", EIGHT, tmp_path, **options))
    two = make_plan(request("Qwen2.5-7B-Instruct", TWO_NODES, tmp_path, **options))
    assert two["verl"]["config"]["actor"]["fsdp_config"]["fsdp_size"] == 8
    assert two["memory"]["assumes"]["sharded_over_ranks"] == one["memory"]["assumes"]["sharded_over_ranks"] == 8
    assert {k: two["memory"]["update"][k] for k in STATE} == {k: one["memory"]["update"][k] for k in STATE}
    assert two["memory"]["token_budget"] == one["memory"]["token_budget"]
    assert two["memory"]["update"] == one["memory"]["update"]
    assert two["fits"] and two["memory"]["phases"]["update"] <= two["memory"]["fill_limit_gib"]


def test_sharding_across_nodes_when_told_so_divides_by_every_rank(tmp_path: Path) -> None:
    across = {"actor.fsdp_config.fsdp_size": -1}
    hsdp = make_plan(request("Qwen2.5-7B-Instruct", TWO_NODES, tmp_path, full_finetune=True))
    told = make_plan(request("Qwen2.5-7B-Instruct", TWO_NODES, tmp_path, overrides=across, full_finetune=True))
    assert told["verl"]["config"]["actor"]["fsdp_config"]["fsdp_size"] == -1
    assert told["memory"]["assumes"]["sharded_over_ranks"] == 16
    for part in ("gradients", "optimizer"):
        assert told["memory"]["update"][part] == pytest.approx(hsdp["memory"]["update"][part] / 2, abs=0.002)
    assert told["memory"]["token_budget"] >= hsdp["memory"]["token_budget"]


def test_the_shard_group_divides_the_state_and_nothing_else() -> None:
    shape = read_shape(MODELS / "Qwen2.5-7B-Instruct")
    eight = UpdateSetup(shape, 8192, ranks=8, lora=False, fsdp=True, logits_path="flash")
    hsdp = dataclasses.replace(eight, ranks=16, shard_group=8)
    assert update_memory(hsdp) == update_memory(eight)
    assert dataclasses.replace(eight, ranks=16, shard_group=-1).shards == 16  # verl: < 0 is every rank
    assert dataclasses.replace(eight, ranks=4, shard_group=8).shards == 4  # ≥ the ranks: every rank


def test_fsdp2s_gathered_copies_are_counted_at_one_rank() -> None:
    """FSDP2 copies each layer in flight into an unsharded compute-dtype buffer at one rank too; agl's own trainer,
    which FSDP does not wrap, has none."""
    shape = read_shape(MODELS / "Qwen2.5-7B-Instruct")
    gathered = (2 * shape.layer_params + shape.vocab * shape.hidden) * 2 / 2**30
    for lora in (True, False):
        plain = UpdateSetup(shape, 4096, lora=lora)
        wrapped = dataclasses.replace(plain, fsdp=True)
        extra = update_memory(wrapped)["weights"] - update_memory(plain)["weights"]
        assert extra == pytest.approx(gathered, abs=0.002)
        assert 1.0 < extra < 3.0
    # at several ranks FSDP gathers whether or not the setup says so (as before)
    several = UpdateSetup(shape, 4096, ranks=8)
    assert update_memory(several) == update_memory(dataclasses.replace(several, fsdp=True))


PLANS = [
    (model, hw, full, flash)
    for model in ("Qwen2.5-1.5B-Instruct", "Qwen2.5-7B-Instruct")
    for hw in (Hardware(1, 1, 80.0), EIGHT, TWO_NODES)
    for full in (False, True)
    for flash in (True, False)
]


@pytest.mark.parametrize(("model", "hw", "full", "flash"), PLANS)
def test_a_plan_never_fills_a_gpu_past_usable_less_headroom(
    model: str, hw: Hardware, full: bool, flash: bool, tmp_path: Path
) -> None:
    req = request(model, hw, tmp_path, **({"full_finetune": True} if full else {}))
    req.flash_attention = flash
    p = make_plan(req)
    memory = p["memory"]
    assert memory["headroom_gib"] == DEFAULT_HEADROOM_GIB == 3.0
    assert memory["fill_limit_gib"] == pytest.approx(memory["usable_gib"] - 3.0, abs=0.01)
    update = next(v for k, v in memory["phases"].items() if k.startswith("update"))
    if p["fits"]:
        assert update <= memory["fill_limit_gib"]
        # vLLM's own share, which vLLM enforces, is held to the usable memory alone
        assert memory["peak_gib_per_gpu"] <= memory["usable_gib"]
    else:
        assert "GiB headroom" in p["refusal"]


# token budgets of the code before the headroom (and before HSDP), one node of 8 × 80 GB, LoRA and full
OLD_BUDGETS = {
    ("Qwen2.5-7B-Instruct", False, True): 45_056,
    ("Qwen2.5-7B-Instruct", False, False): 24_576,
    ("Qwen2.5-7B-Instruct", True, True): 32_768,
    ("Llama-3.2-3B-Instruct", True, True): 49_152,
}


@pytest.mark.parametrize(("model", "full", "flash"), list(OLD_BUDGETS))
def test_headroom_0_reproduces_the_old_fill(model: str, full: bool, flash: bool, tmp_path: Path) -> None:
    options = {"full_finetune": True} if full else {}
    req = request(model, EIGHT, tmp_path, **options)
    req.flash_attention = flash
    kept = make_plan(req)
    req.headroom_gib = 0.0
    filled = make_plan(req)
    assert filled["memory"]["fill_limit_gib"] == filled["memory"]["usable_gib"] == pytest.approx(0.92 * 80)
    assert filled["memory"]["token_budget"] == OLD_BUDGETS[(model, full, flash)]
    assert kept["memory"]["token_budget"] <= filled["memory"]["token_budget"]


@pytest.mark.parametrize("headroom", [-1.0, 0.92 * 80, 100.0, math.nan])
def test_a_bad_headroom_is_refused_by_the_options_name(headroom: float, tmp_path: Path) -> None:
    req = request("Qwen2.5-1.5B-Instruct", EIGHT, tmp_path)
    req.headroom_gib = headroom
    with pytest.raises(ValueError, match="--headroom-gib"):
        fill_limit(req)
    with pytest.raises(ValueError, match="--headroom-gib"):
        make_plan(req)


def test_the_plan_states_its_headroom_and_why(tmp_path: Path) -> None:
    p = make_plan(request("Qwen2.5-1.5B-Instruct", EIGHT, tmp_path))
    why = p["memory"]["headroom_why"]
    assert p["memory"]["headroom_gib"] == 3.0
    assert "CPU" in why and "fp32" in why and "flash-attn" in why


def test_a_model_whose_state_a_node_cannot_hold_is_told_to_shard_across_nodes(tmp_path: Path) -> None:
    """Full fine-tuning of a 70B model on 4 nodes × 8: one node's 8 shards hold ~130 GiB each, every rank's 32 fit;
    the refusal names the setting, and with it the plan fits."""
    four = Hardware(8, 4, 80.0)
    refused = make_plan(request("Llama-3.1-70B-Instruct", four, tmp_path, full_finetune=True))
    assert not refused["fits"] and "actor.fsdp_config.fsdp_size=-1" in refused["refusal"]
    across = {"actor.fsdp_config.fsdp_size": -1}
    told = make_plan(request("Llama-3.1-70B-Instruct", four, tmp_path, overrides=across, full_finetune=True))
    assert told["fits"], told["refusal"]
    assert told["memory"]["assumes"]["sharded_over_ranks"] == 32


def test_the_cli_takes_headroom_gib_and_refuses_a_bad_one(tmp_path: Path) -> None:
    common = [sys.executable, "-m", "agl.cli.main", "train", "--example", "calculator", "--plan"]
    common += ["--model", str(MODELS / "Qwen2.5-1.5B-Instruct"), "--trainer", "verl", "--engine", "vllm"]
    common += ["--run-dir", str(tmp_path / "run"), "--gpus-per-node", "1", "--gpu-memory-gib", "80"]
    bad = subprocess.run([*common, "--headroom-gib", "-1"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and "--headroom-gib -1 must be at least 0" in bad.stderr
    ok = subprocess.run([*common, "--headroom-gib", "5"], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert '"headroom_gib": 5.0' in ok.stdout


def test_a_runs_headroom_is_the_configs(tmp_path: Path) -> None:
    """`agl train --headroom-gib` sets the config's, which the run's own plan (agl_trainer.run.setup.plan_request)
    keeps as `agl train --plan` does."""
    from agl_trainer.run.setup import plan_request

    req = request("Qwen2.5-1.5B-Instruct", EIGHT, tmp_path)
    config = dataclasses.replace(req.config, headroom_gib=6.5)
    p = make_plan(plan_request(config, EIGHT))
    assert p["memory"]["headroom_gib"] == 6.5
    assert p["memory"]["fill_limit_gib"] == pytest.approx(0.92 * 80 - 6.5, abs=0.01)
