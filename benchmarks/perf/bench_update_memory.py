"""The plan's memory estimate (`agl_trainer.plan.memory.update_memory`) against a measured peak on this CPU.

For the bundled model in fp32 with LoRA (r16 on q/k/v/o) or full fine-tuning, two updates as verl's actor does
them (the second is the steady state: AdamW's moments exist by then): logits for every token, log-softmax in
fp32, the policy-gradient loss on the token log-probs, backward, AdamW step. Each budget
runs in a fresh process; the peak is the process's high-water resident memory (VmHWM) minus its resident memory
before the model was loaded, with glibc told to map every large allocation on its own (so that memory freed by
one phase of the update is not counted as resident in the next). Sequences are of equal length and unpadded, so attention takes PyTorch's flash
kernel on CPU as it takes flash/sdpa kernels on a GPU (no seq × seq matrix is kept).

    python benchmarks/perf/bench_update_memory.py            # budgets 1024, 2048, 4096 tokens
    python benchmarks/perf/bench_update_memory.py --tokens 2048 --checkpointing
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

SEQUENCE = 256  # tokens per sequence; a budget of T tokens is T / 256 sequences


def rss_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure(tokens: int, checkpointing: bool, full: bool) -> dict[str, Any]:
    """One update in this process; the peak above the resident memory before the model loaded, in GiB."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from agl_trainer.models import resolve_model

    torch.manual_seed(0)
    path = resolve_model("bundled")
    before = rss_mb("VmRSS")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    if not full:
        lora = LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
        model = get_peft_model(model, lora)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    ids = torch.randint(0, model.config.vocab_size, (tokens // SEQUENCE, SEQUENCE))
    for _ in range(2):  # the second update is the steady state: AdamW's moments exist from the first step on
        optimizer.zero_grad(set_to_none=True)
        logits = model(input_ids=ids).logits.float()
        logprobs = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        loss = -(logprobs * torch.randn_like(logprobs)).mean()
        loss.backward()
        del logits, logprobs, loss
        optimizer.step()
    peak = rss_mb("VmHWM")
    return {"tokens": tokens, "checkpointing": checkpointing, "full": full, "measured_gib": (peak - before) / 1024}


def estimate(tokens: int, checkpointing: bool, full: bool) -> dict[str, float]:
    from agl_trainer.model_shape import read_shape
    from agl_trainer.models import resolve_model
    from agl_trainer.plan.memory import UpdateSetup, update_memory

    shape = read_shape(resolve_model("bundled"))
    setup = UpdateSetup(shape, tokens, lora=not full, compute_bytes=4, gradient_checkpointing=checkpointing, cuda=False)
    return update_memory(setup)


def compare(tokens: int, checkpointing: bool, full: bool = False) -> dict[str, Any]:
    """Measure in a fresh process (its peak is its own), estimate here."""
    flags = ["--child", "--tokens", str(tokens)] + (["--checkpointing"] if checkpointing else [])
    flags += ["--full"] if full else []
    # every allocation of 128 KiB or more is its own mapping, returned to the system when freed: the resident
    # high-water mark is then the peak of live tensors, not of memory glibc kept after they were freed
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}
    out = subprocess.run(
        [sys.executable, __file__, *flags], capture_output=True, text=True, check=True, timeout=900, env=env
    )
    measured = json.loads(out.stdout.strip().splitlines()[-1])
    parts = estimate(tokens, checkpointing, full)
    return {**measured, "estimated_gib": parts["total"], "ratio": parts["total"] / measured["measured_gib"], **parts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, action="append")
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--full", action="store_true", help="full fine-tuning instead of LoRA")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.tokens[0], args.checkpointing, args.full)))
        return
    for tokens in args.tokens or [1024, 2048, 4096]:
        row = compare(tokens, args.checkpointing, args.full)
        what = ("full fine-tuning" if args.full else "LoRA") + (", checkpointing" if args.checkpointing else "")
        print(
            f"{tokens:>6} tokens ({what}): measured "
            f"{row['measured_gib']:.2f} GiB, estimated {row['estimated_gib']:.2f} GiB (×{row['ratio']:.2f}); "
            + ", ".join(f"{k} {row[k]:.2f}" for k in ("weights", "gradients", "optimizer", "activations", "logits"))
        )


def smoke() -> None:
    """`make bench-smoke`: that this script runs, at a small size (the numbers are not judged)."""
    row = compare(256, False, False)
    print(f"256 tokens: measured {row['measured_gib']:.2f} GiB, estimated {row['estimated_gib']:.2f} GiB")


if __name__ == "__main__":
    main()
