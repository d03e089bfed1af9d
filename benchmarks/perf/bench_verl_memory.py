"""The plan's memory estimate for an update against the peak of verl's real actor worker on this CPU.

`agl train --plan` charges each GPU an update's weights, gradients, optimizer moments, activations and logits
(`agl_trainer.plan.memory.update_memory`). Here the same formula, in the CPU's terms (fp32, padded batches, no
flash-attn, so verl's `logprobs_from_logits_v2` path), is set against what verl's `ActorRolloutRefWorker`
(agl's `VerlPolicy`, one rank on a local Ray) holds at its peak during the second of two updates on the bundled
model (SmolLM2-135M, a 49,152-token vocabulary): micro-batches filled to the token budget with sequences of 256
tokens sampled at T = 0.7. The peak is the worker's resident high-water mark (VmHWM, reset after the first update) minus what was
resident before the model loaded, with glibc mapping every large allocation on its own, so that memory freed by
one phase is not counted as resident in the next.

    python benchmarks/perf/bench_verl_memory.py                       # LoRA and full fine-tuning, 1024 and 2048 tokens
    python benchmarks/perf/bench_verl_memory.py --tokens 2048 --full --checkpointing
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

SEQUENCE = 256  # tokens per sequence (half prompt, half response)
TEMPERATURE = 0.7  # an agent's sampling temperature: verl scales the logits into a new tensor (the plan counts it)
GIB = 2**30


def measure(tokens: int, *, full: bool, checkpointing: bool, micro_batches: int = 2) -> dict[str, Any]:
    """Two updates of verl's worker on `micro_batches` full micro-batches of `tokens` tokens; the second's peak."""
    import random

    from agl.learn.transitions import Transition
    from agl_trainer.config import PolicyConfig
    from agl_trainer.models import resolve_model
    from agl_trainer.verl.backend import VerlPolicy

    path = resolve_model("bundled")
    cfg = PolicyConfig(lora=not full, lr=1e-5, micro_batch_tokens=tokens)
    rng = random.Random(0)
    rows = micro_batches * (tokens // SEQUENCE)
    half = SEQUENCE // 2
    batch = [
        Transition(
            rollout_id=f"r{i}",
            task_id="t",
            attempt_id="a",
            seq=0,
            agent_name=None,
            prompt_ids=[rng.randrange(100, 40_000) for _ in range(half)],
            response_ids=[rng.randrange(100, 40_000) for _ in range(half)],
            response_mask=[1] * half,
            logprobs=[-1.0] * half,
            model_version=None,
            call_ids=[f"c{i}"],
            advantage=(-1.0) ** i,
            weight=1.0,
            temperature=TEMPERATURE,
        )
        for i in range(rows)
    ]
    overrides = {"model.enable_gradient_checkpointing": True} if checkpointing else {}
    with VerlPolicy(path, cfg, overrides=overrides) as policy:
        policy.update(batch)  # the first update creates AdamW's moments; the second is the steady state
        policy.peak_memory(reset=True)
        stats = policy.update(batch)
        (peak,) = policy.peak_memory()
    return {
        "tokens": tokens,
        "full": full,
        "checkpointing": checkpointing,
        "micro_batches": stats.micro_batches,
        "measured_gib": (peak["allocated"] - peak["before_model"]) / GIB,
    }


def estimate(tokens: int, *, full: bool, checkpointing: bool) -> dict[str, float]:
    from agl_trainer.model_shape import read_shape
    from agl_trainer.models import resolve_model
    from agl_trainer.plan.memory import UpdateSetup, update_memory

    shape = read_shape(resolve_model("bundled"))
    setup = UpdateSetup(
        shape,
        tokens,
        fsdp=True,  # verl's actor, as the plan charges it: FSDP2's gathered copies at one rank too
        lora=not full,
        compute_bytes=4,
        gradient_checkpointing=checkpointing,
        cuda=False,
        logits_path="torch",
    )
    return update_memory(setup)


def compare(tokens: int, *, full: bool, checkpointing: bool) -> dict[str, Any]:
    """Measure in a fresh process (with its own Ray: the worker's peak is its own), estimate here."""
    flags = (
        ["--child", "--tokens", str(tokens)]
        + (["--full"] if full else [])
        + (["--checkpointing"] if checkpointing else [])
    )
    # glibc maps every allocation of 128 KiB or more on its own and unmaps it when freed: the worker's high-water
    # mark is then the peak of live tensors (Ray's workers inherit this environment)
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}
    out = subprocess.run(
        [sys.executable, __file__, *flags], capture_output=True, text=True, check=False, timeout=1800, env=env
    )
    if out.returncode != 0:
        raise RuntimeError(f"the measuring process failed:\n{out.stderr[-3000:]}")
    measured = json.loads(out.stdout.strip().splitlines()[-1])
    parts = estimate(tokens, full=full, checkpointing=checkpointing)
    return {**measured, **parts, "estimated_gib": parts["total"], "ratio": parts["total"] / measured["measured_gib"]}


def line(row: dict[str, Any]) -> str:
    what = ("full fine-tuning" if row["full"] else "LoRA") + (", checkpointing" if row["checkpointing"] else "")
    parts = ", ".join(f"{k} {row[k]:.2f}" for k in ("weights", "gradients", "optimizer", "activations", "logits"))
    return (
        f"{row['tokens']:>6} tokens ({what}, {row['micro_batches']} micro-batches): verl's worker peaked at "
        f"{row['measured_gib']:.2f} GiB, the plan estimates {row['estimated_gib']:.2f} GiB (×{row['ratio']:.2f}); {parts}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, action="append")
    parser.add_argument("--full", action="store_true", help="full fine-tuning only (default: LoRA, then full)")
    parser.add_argument("--lora", action="store_true", help="LoRA only")
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import ray

        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
        try:
            row = measure(args.tokens[0], full=args.full, checkpointing=args.checkpointing)
        finally:
            ray.shutdown()
        print(json.dumps(row))
        return
    kinds = [False] if args.lora else [True] if args.full else [False, True]
    for full in kinds:
        for tokens in args.tokens or [1024, 2048]:
            print(line(compare(tokens, full=full, checkpointing=args.checkpointing)), flush=True)


def smoke() -> None:
    """`make bench-smoke`: that this script runs, at a small size (the numbers are not judged)."""
    print(line(compare(512, full=False, checkpointing=False)))


if __name__ == "__main__":
    main()
