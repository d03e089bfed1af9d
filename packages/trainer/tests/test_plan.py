"""`agl train --plan` for GPUs this machine does not have: 1 × 80 GB, 8 × 80 GB and 2 nodes × 8, on the published
configs of Qwen2.5-1.5B, Llama-3.2-3B and Qwen2.5-7B (config.json only, no weights), and a 70B model on one GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agl_trainer.options import build_config
from agl_trainer.plan.build import PlanRequest, make_plan, plan_run
from agl_trainer.plan.hardware import Hardware

MODELS = Path(__file__).parent / "data" / "models"
ONE = Hardware(1, 1, 80.0)
EIGHT = Hardware(8, 1, 80.0)
TWO_NODES = Hardware(8, 2, 80.0)


def config(model: str, tmp_path: Path, **options: Any) -> Any:
    base = {
        "model": str(MODELS / model),
        "train_tasks": [{"q": 1}],
        "eval_tasks": [{"q": 1}],
        "run_dir": tmp_path / "run",
        "trainer": "verl",
        "engine": "vllm",
    }
    return build_config("agl_trainer.examples.calculator:solve", {**base, **options})


def plan(model: str, hardware: Hardware, tmp_path: Path, rollout_gpus: int | None = None, **options: Any) -> Any:
    req = PlanRequest(config(model, tmp_path, **options), hardware, rollout_gpus=rollout_gpus, flash_attention=True)
    return make_plan(req)


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


@pytest.mark.parametrize("model", ["Qwen2.5-1.5B-Instruct", "Llama-3.2-3B-Instruct", "Qwen2.5-7B-Instruct"])
@pytest.mark.parametrize(
    ("hardware", "workers"), [(ONE, 1), (EIGHT, 8), (TWO_NODES, 16)], ids=["1x80", "8x80", "2x8x80"]
)
def test_plans_fit_and_name_the_right_vllm_and_verl_settings(
    model: str, hardware: Hardware, workers: int, tmp_path: Path
) -> None:
    cluster = {"ray_address": "auto", "checkpoint_dir": str(tmp_path / "shared")} if hardware.nodes > 1 else {}
    p = plan(model, hardware, tmp_path, trainer_workers=workers, **cluster)
    assert p["fits"] and p["refusal"] is None, p["refusal"]
    assert p["memory"]["peak_gib_per_gpu"] <= 0.92 * 80
    # a vLLM server per data-parallel rank of each node (LoRA: vLLM refuses several API servers with runtime
    # LoRA), with the family's parser, a max length from the longest transition, the colocated layout's memory
    # share and sleep mode, and every GPU of the node between them
    per_node = p["placement"]["vllm"]["servers_per_node"]
    assert len(p["vllm"]) == hardware.nodes * per_node
    for server in p["vllm"]:
        argv = server["argv"]
        assert flag(argv, "--tool-call-parser") == ("llama3_json" if model.startswith("Llama") else "hermes")
        assert flag(argv, "--max-model-len") == "2048"
        assert float(flag(argv, "--gpu-memory-utilization") or 0) == pytest.approx(0.85)
        assert "--enable-sleep-mode" in argv and server["env"]["VLLM_SERVER_DEV_MODE"] == "1"
        tp = int(flag(argv, "--tensor-parallel-size") or 1)
        dp = int(flag(argv, "--data-parallel-size") or 1)
        assert tp * dp * per_node == hardware.gpus_per_node
    # the trainer's ranks fill nodes in order: [8, 8] on two nodes, never one pool larger than a node
    assert p["placement"]["gpus_per_node"] == [hardware.gpus_per_node] * hardware.nodes
    # verl's config, checked by verl's dataclasses: bf16 compute, the LoRA policy's frozen base loaded in bf16 (its
    # adapter fp32), checkpointing, remove-padding
    verl = p["verl"]
    assert verl["validated"] is True
    actor = verl["config"]["actor"]
    assert actor["fsdp_config"]["mixed_precision"]["param_dtype"] == "bf16"
    assert actor["fsdp_config"]["model_dtype"] == verl["profile"]["weights_dtype"] == "bf16"
    assert verl["config"]["model"]["enable_gradient_checkpointing"] is True
    assert verl["config"]["model"]["use_remove_padding"] is True
    assert verl["config"]["model"]["override_config"]["attn_implementation"] == "flash_attention_2"
    assert actor["ppo_max_token_len_per_gpu"] == p["memory"]["token_budget"] >= 2048


def test_a_split_layout_gives_vllm_its_own_gpus(tmp_path: Path) -> None:
    p = plan("Qwen2.5-7B-Instruct", EIGHT, tmp_path, rollout_gpus=2, trainer_workers=6)
    assert p["fits"] and p["placement"]["mode"] == "split"
    assert p["placement"]["gpus_per_node"] == [6]
    # the node's last two, a server on each (LoRA); the trainer's Ray has 0-5
    assert [s["env"]["CUDA_VISIBLE_DEVICES"] for s in p["vllm"]] == ["6", "7"]
    for server in p["vllm"]:
        assert "--enable-sleep-mode" not in server["argv"] and server["gpus"] == 1
        assert float(flag(server["argv"], "--gpu-memory-utilization") or 0) == pytest.approx(0.9)


def test_a_70b_model_on_one_80_gb_gpu_is_refused_with_the_knob_named(tmp_path: Path) -> None:
    p = plan("Llama-3.1-70B-Instruct", ONE, tmp_path)
    assert not p["fits"]
    assert "--gpus-per-node" in p["refusal"] and "--trainer-workers" in p["refusal"]
    # on 2 nodes × 8 with every GPU training, it plans
    big = plan(
        "Llama-3.1-70B-Instruct", TWO_NODES, tmp_path, trainer_workers=16, ray_address="auto", checkpoint_dir="/shared"
    )
    assert big["fits"], big["refusal"]
    (tp,) = {int(flag(s["argv"], "--tensor-parallel-size") or 1) for s in big["vllm"]}
    assert tp >= 4  # 141 GB of bf16 weights cannot sit on fewer than four 80 GB GPUs with a KV cache


def test_full_fine_tuning_that_does_not_fit_names_more_ranks(tmp_path: Path) -> None:
    p = plan("Qwen2.5-7B-Instruct", EIGHT, tmp_path, full_finetune=True, trainer_workers=1)
    assert not p["fits"] and "--trainer-workers" in p["refusal"]
    assert plan("Qwen2.5-7B-Instruct", EIGHT, tmp_path, full_finetune=True, trainer_workers=8)["fits"]


def test_warnings_say_what_to_change(tmp_path: Path) -> None:
    req = PlanRequest(config("Qwen2.5-1.5B-Instruct", tmp_path, trainer_workers=2), EIGHT, flash_attention=False)
    p = make_plan(req)
    changes = {w["change"] for w in p["warnings"]}
    assert "--trainer-workers 8" in changes
    assert any("flash-attn" in c for c in changes)
    assert p["verl"]["config"]["model"]["use_remove_padding"] is False
    two = make_plan(PlanRequest(config("Qwen2.5-1.5B-Instruct", tmp_path, trainer_workers=16), TWO_NODES))
    assert any("--ray-address" in w["change"] for w in two["warnings"])
    # on a cluster, checkpoints need a folder every node mounts: refused without one, as the run would be
    with pytest.raises(ValueError, match="checkpoint_dir"):
        make_plan(
            PlanRequest(config("Qwen2.5-1.5B-Instruct", tmp_path, trainer_workers=16, ray_address="x"), TWO_NODES)
        )


def test_verl_set_reaches_the_config_and_bad_keys_are_refused(tmp_path: Path) -> None:
    from agl_trainer.verl.settings import parse_overrides

    cfg = config("Qwen2.5-1.5B-Instruct", tmp_path)
    overrides = parse_overrides(["actor.optim.betas=[0.9,0.95]", "actor.optim.lr=3e-6"])
    p = make_plan(PlanRequest(cfg, ONE, verl_overrides=overrides))
    assert p["verl"]["config"]["actor"]["optim"]["betas"] == [0.9, 0.95]
    assert p["verl"]["config"]["actor"]["optim"]["lr"] == 3e-6
    with pytest.raises(ValueError, match="does not have"):
        make_plan(PlanRequest(cfg, ONE, verl_overrides={"actor.nope": 1}))


def run_plan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agl.cli.main", "train", "--example", "calculator", "--plan", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_cli_prints_the_plan_and_exits_2_when_it_does_not_fit(tmp_path: Path) -> None:
    common = ["--trainer", "verl", "--engine", "vllm", "--run-dir", str(tmp_path / "run"), "--gpus-per-node", "1"]
    ok = run_plan("--model", str(MODELS / "Llama-3.2-3B-Instruct"), *common, "--verl-set", "actor.optim.lr=1e-6")
    assert ok.returncode == 0, ok.stderr[-2000:]
    printed = json.loads(ok.stdout)
    assert printed["fits"] and printed["verl"]["config"]["actor"]["optim"]["lr"] == 1e-6
    assert not (tmp_path / "run").exists()  # nothing started, nothing written
    refused = run_plan("--model", str(MODELS / "Llama-3.1-70B-Instruct"), *common)
    assert refused.returncode == 2
    assert json.loads(refused.stdout)["fits"] is False
    assert "would not fit" in refused.stderr and "--gpus-per-node" in refused.stderr
    bad = run_plan("--model", str(MODELS / "Llama-3.2-3B-Instruct"), *common, "--verl-set", "actor.optim.nope=1")
    assert bad.returncode == 1 and "does not have: actor.optim.nope" in bad.stderr


def test_overlap_is_planned_only_where_rollouts_can_run_during_updates(tmp_path: Path) -> None:
    """max_staleness: on shared GPUs vLLM sleeps during each update, so the plan runs it as 0 and says how to
    overlap (vLLM on GPUs of its own); the split layout keeps it."""
    shared = plan("Qwen2.5-7B-Instruct", EIGHT, tmp_path, trainer_workers=8, max_staleness=1)
    assert shared["placement"]["mode"] == "colocated" and shared["run"]["max_staleness"] == 0
    (warning,) = [w for w in shared["warnings"] if "max_staleness" in w["message"]]
    assert "sleeps during each update" in warning["message"] and warning["change"].startswith("--rollout-gpus")
    split = plan("Qwen2.5-7B-Instruct", EIGHT, tmp_path, rollout_gpus=2, trainer_workers=6, max_staleness=1)
    assert split["run"]["max_staleness"] == 1 and not any("max_staleness" in w["message"] for w in split["warnings"])
    assert plan("Qwen2.5-7B-Instruct", EIGHT, tmp_path, trainer_workers=8)["run"]["max_staleness"] == 0
    # vLLM on GPUs of its own that would idle during updates: the plan says how not to
    idle = plan("Qwen2.5-7B-Instruct", EIGHT, tmp_path, rollout_gpus=2, trainer_workers=6)
    assert any(w["change"].startswith("--max-staleness 1") for w in idle["warnings"])


def test_the_estimate_follows_the_path_verl_takes(tmp_path: Path) -> None:
    """With flash-attn verl packs sequences and its cross-entropy writes its gradient in place (fewer bytes of logits
    per token, a larger budget); without it the PyTorch path keeps more copies; a LoRA base is charged at bf16, which
    is how verl now loads it; 8 GPUs get at least the 24k tokens per GPU of verl's own Qwen2.5-7B GRPO example."""
    from agl_trainer.plan.memory import logit_bytes

    assert logit_bytes("flash", 2) == 6 and logit_bytes("torch", 2) == 12 and logit_bytes("agl", 2) == 14
    assert logit_bytes("flash", 2, temperature_scaled=False) == 4
    flash = plan("Qwen2.5-7B-Instruct", EIGHT, tmp_path, trainer_workers=8)
    padded = make_plan(
        PlanRequest(config("Qwen2.5-7B-Instruct", tmp_path, trainer_workers=8), EIGHT, flash_attention=False)
    )
    assert (
        flash["memory"]["assumes"]["logits_path"] == "flash" and padded["memory"]["assumes"]["logits_path"] == "torch"
    )
    assert flash["memory"]["token_budget"] > padded["memory"]["token_budget"] >= 24_576
    assert "bf16" in flash["memory"]["assumes"]["weights"] and "fp32" in flash["memory"]["assumes"]["weights"]
    one = plan("Qwen2.5-7B-Instruct", ONE, tmp_path)
    # the base in bf16, and FSDP2's bf16 copies of the layers in flight (two of 233M) and the embedding (545M),
    # which it makes at one rank too
    gathered = (2 * 233.0e6 + 152_064 * 3584) * 2 / 2**30
    assert one["memory"]["update"]["weights"] == pytest.approx(7.62e9 * 2 / 2**30 + gathered, rel=0.02)


def test_the_gpu_guide_table_is_the_plans(tmp_path: Path) -> None:
    from agl_trainer.plan.table import MODELS as TABLE_MODELS
    from agl_trainer.plan.table import SHAPES, plan_table

    table = plan_table(MODELS)
    rows = [r for r in table.splitlines() if r.startswith("| ") and "---" not in r][1:]
    assert len(rows) == len(TABLE_MODELS) * len(SHAPES) * 2
    budgets = {tuple(c.strip() for c in r.split("|")[1:4]): int(r.split("|")[5].replace(",", "")) for r in rows}
    for (model, shape, flash), budget in budgets.items():
        if flash == "yes":
            assert budget >= budgets[(model, shape, "no")], (model, shape)
    docs = (Path(__file__).parents[3] / "docs" / "guides" / "gpus.md").read_text()
    assert "<!-- agl:gpu-plans -->" in docs  # the guide shows this table, made at every docs build


def test_ranks_over_several_nodes_shard_within_a_node_and_replicate_across(tmp_path: Path) -> None:
    """HSDP (issue #42): on two nodes of 8, verl's FSDP shard group is a node's 8 ranks (its mesh 2 × 8, verl's
    numbering node by node), so a layer's all-gather never crosses nodes; on one node, or told so, one mesh."""
    from agl_trainer.verl.settings import hsdp_shard_size, parse_overrides

    cfg = config("Qwen2.5-7B-Instruct", tmp_path)
    two = make_plan(PlanRequest(cfg, TWO_NODES, flash_attention=True))
    assert two["placement"]["gpus_per_node"] == [8, 8]
    assert two["verl"]["config"]["actor"]["fsdp_config"]["fsdp_size"] == 8
    one = make_plan(PlanRequest(cfg, EIGHT, flash_attention=True))
    assert one["verl"]["config"]["actor"]["fsdp_config"]["fsdp_size"] == -1
    across = parse_overrides(["actor.fsdp_config.fsdp_size=-1"])
    told = make_plan(PlanRequest(cfg, TWO_NODES, flash_attention=True, verl_overrides=across))
    assert told["verl"]["config"]["actor"]["fsdp_config"]["fsdp_size"] == -1
    assert [hsdp_shard_size(p) for p in ([8, 8], [4, 4, 4], [8], [1, 1], [8, 4], [])] == [8, 4, -1, -1, -1, -1]


def test_a_trainer_rank_given_one_of_vllms_gpus_refuses_to_run(tmp_path: Path) -> None:
    """The split layout on a cluster the user started (issue #42): Ray knows nothing of the vLLM servers beside it,
    so each rank checks the GPUs Ray gave it against those the plan gives vLLM, and refuses, saying how to start
    the nodes. The plan and the run agree on which those are: each node's last ones."""
    from agl_trainer.run.setup import split_vllm_gpus
    from agl_trainer.verl.placement import gpu_clash

    cfg = config("Qwen2.5-7B-Instruct", tmp_path)
    _, split = plan_run(PlanRequest(cfg, TWO_NODES, rollout_gpus=2, flash_attention=True))
    assert split.layout.mode == "split" and split_vllm_gpus(split) == (6, 7)
    assert split.layout.trainer_gpus_per_node == [6, 6]
    assert gpu_clash(["0", "5"], (6, 7), "10.0.0.2") is None
    refusal = gpu_clash(["5", "7"], (6, 7), "10.0.0.2")
    assert refusal is not None and "GPU(s) [7]" in refusal and "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5" in refusal
    assert "--num-gpus 6" in refusal and "10.0.0.2" in refusal
    _, colocated = plan_run(PlanRequest(cfg, TWO_NODES, flash_attention=True))
    assert colocated.layout.mode == "colocated" and split_vllm_gpus(colocated) == ()
