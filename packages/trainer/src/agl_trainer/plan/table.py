"""The GPU guide's table of plans, made by `agl train --plan`'s own code (the docs build calls `plan_table`).

For each published model config (config.json only, no weights) and machine shape: LoRA r16, transitions of up to
2,048 tokens, verl on vLLM, colocated, 80 GB GPUs, with flash-attn and without it, the default headroom kept
(`agl_trainer.plan.build.DEFAULT_HEADROOM_GIB`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from agl_trainer.plan.hardware import Hardware

MODELS = ("Qwen2.5-1.5B-Instruct", "Llama-3.2-3B-Instruct", "Qwen2.5-7B-Instruct")
SHAPES = ((1, 1), (8, 1), (8, 2))  # GPUs per node, nodes


def plan_for(model_dir: Path, hardware: Hardware, *, flash_attention: bool, run_dir: Path, **options: Any) -> Any:
    """The plan of the calculator example's run with `model_dir` on `hardware` (verl on vLLM, every GPU training)."""
    from agl_trainer.options import build_config
    from agl_trainer.plan.build import PlanRequest, make_plan

    cluster = {"ray_address": "auto", "checkpoint_dir": str(run_dir / "shared")} if hardware.nodes > 1 else {}
    values = {
        "model": str(model_dir),
        "train_tasks": [{"q": 1}],
        "eval_tasks": [{"q": 1}],
        "run_dir": run_dir,
        "trainer": "verl",
        "engine": "vllm",
        "trainer_workers": hardware.gpus,
        **cluster,
        **options,
    }
    config = build_config("agl_trainer.examples.calculator:solve", values)
    return make_plan(PlanRequest(config, hardware, flash_attention=flash_attention))


def plan_table(models_dir: Path, gpu_memory_gib: float = 80.0) -> str:
    """The table as Markdown (GiB per GPU; the plan's own estimates)."""
    head = (
        "| model | nodes × GPUs | flash-attn | vLLM per node | token budget | update: weights / activations / "
        "logits / total | peak: rollouts / update | fits | tool parser |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in MODELS:
            for per_node, nodes in SHAPES:
                for flash in (True, False):
                    p = plan_for(
                        models_dir / model,
                        Hardware(per_node, nodes, gpu_memory_gib),
                        flash_attention=flash,
                        run_dir=Path(tmp) / "run",
                    )
                    vllm = p["placement"]["vllm"]
                    serving = f"TP {vllm['tensor_parallel']}" + (
                        f" × DP {vllm['data_parallel']}" if vllm["data_parallel"] > 1 else ""
                    )
                    servers = vllm.get("servers_per_node", 1)
                    if servers > 1:  # LoRA over data-parallel ranks: a server per rank (vllm_server.split_per_gpu)
                        serving = f"{servers} servers of TP {vllm['tensor_parallel']}"
                    update = p["memory"]["update"]
                    phases = list(p["memory"]["phases"].values())
                    parser = p["vllm"][0]["tool_parser"]["parser"]
                    rows.append(
                        f"| {model.removesuffix('-Instruct')} | {nodes} × {per_node} | {'yes' if flash else 'no'} "
                        f"| {serving} | {p['memory']['token_budget']:,} | {update['weights']:.1f} / "
                        f"{update['activations']:.1f} / {update['logits']:.1f} / {update['total']:.1f} | "
                        f"{phases[0]:.1f} / {phases[1]:.1f} | {'yes' if p['fits'] else 'no'} | {parser} |"
                    )
    return head + "\n".join(rows) + "\n"
