"""Two colocated verl updates with agl's embedded engine for the rollouts: the GPU smoke check's verl stage.

Each step: the embedded engine (`agl_trainer.engines.embedded.Engine`, the model with a LoRA adapter, in this process)
answers the calculator example's first turn for a few tasks, several samples each; the answers are scored and given
group-relative advantages; then verl's actor (`agl_trainer.verl.backend.VerlPolicy`: verl's `ActorRolloutRefWorker`
in a Ray worker) takes its turn the way colocation does it: `to_device()` (verl's own move back onto the
accelerator), the update, the new adapter copied into the engine's model (`load_into`), `to_host()` (verl's move to
host memory, then the cache emptied). The worker's peak memory during the update (`peak_memory()`, reset when the
turn starts) is printed against the plan's estimate (`agl_trainer.plan.memory.update_memory`) for the same model,
precision and micro-batch tokens: at the budget the run is configured with (what the plan checks), and at the
tokens this update really put in one micro-batch.

The reward is the calculator example's, shaped so that a smoke run always has something to learn from (a 135 M
model often gets every answer of a task equally wrong, which gives no advantage at all): 1 for the right number,
0.2 for a well-formed tool call, less 0.001 per response token; and the samples of a group are capped at lengths
that differ by a token each (--max-tokens, one less, ...), so that a model that never stops early (the randomly
initialised one smoke.sh builds where the bundled model's weights are not installed) still gives its group rewards
that differ.

    python benchmarks/gpu/verl_update.py [--device cuda|cpu] [--steps 2] [--tasks 4] [--group 4]
                                         [--max-tokens 48] [--model bundled] [--json OUT]

Exit status 0 when every step updated (a loss and a gradient norm, tokens trained) and the worker logged a move to
the device and one to the host per step; 1 otherwise.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

GIB = float(2**30)


def _rewards(texts: list[str], answer: float, lengths: list[int]) -> list[float]:
    from agl_trainer.chat_format import parse_answer
    from agl_trainer.examples.calculator import CALCULATOR, final_number

    out = []
    for text, length in zip(texts, lengths, strict=True):
        parsed = parse_answer(text, [CALCULATOR])
        number = final_number(parsed.content or "")
        right = number is not None and math.isclose(number, float(answer), rel_tol=1e-6, abs_tol=1e-6)
        out.append((1.0 if right else 0.0) + (0.2 if parsed.tool_calls else 0.0) - 0.001 * length)
    return out


def _advantages(rewards: list[float]) -> list[float]:
    """GRPO's: each sample's reward less its group's mean, over the group's standard deviation."""
    mean = statistics.fmean(rewards)
    spread = statistics.pstdev(rewards)
    return [(r - mean) / (spread + 1e-6) for r in rewards]


def _estimate(model_path: Path, policy: Any, tokens: int) -> dict[str, float]:
    from agl_trainer.model_shape import read_shape
    from agl_trainer.plan.memory import UpdateSetup, update_memory

    profile, config = policy.profile, policy.config
    setup = UpdateSetup(
        read_shape(model_path),
        tokens,
        ranks=policy.workers,
        fsdp=True,  # verl's actor: FSDP2 gathers compute copies of the layers in flight at any number of ranks
        lora=config.lora,
        lora_rank=config.lora_rank,
        lora_targets=tuple(config.lora_targets),
        compute_bytes=2 if profile.dtype == "bf16" else 4,
        gradient_checkpointing=profile.gradient_checkpointing,
        # the path verl takes from logits to log-probs, as the plan charges it (agl_trainer.plan.memory.logit_bytes)
        logits_path="flash" if profile.remove_padding else "torch",
        cuda=profile.device == "cuda",
    )
    return update_memory(setup)


def _micro_batch_tokens(policy: Any, transitions: list[Any]) -> tuple[int, int]:
    """(the token budget verl was given for this batch, the positions of its largest micro-batch). With
    remove-padding verl splits a batch into ceil(tokens / budget) micro-batches balanced by token count; without
    it agl gives verl micro-batches of k sequences, k × the batch's longest ≤ the budget, k dividing each rank's
    rows (`VerlPolicy._micro_batching`), each a padded block of k × the longest."""
    lengths = [len(t.prompt_ids) + len(t.response_ids) for t in transitions]
    budget = int(policy.profile.token_budget)
    if policy.device == "cpu":  # VerlPolicy lowers a CPU's budget to keep the logits within CPU_LOGITS_BYTES
        from agl_trainer.verl.cpu import cpu_micro_batch_tokens

        budget = cpu_micro_batch_tokens(budget, policy.vocab_size, max(lengths))
    if policy.profile.remove_padding:
        count = min(len(lengths), max(1, math.ceil(sum(lengths) / budget)))
        return budget, math.ceil(sum(lengths) / count)
    rows = -(-len(lengths) // policy.workers)  # per rank, the batch padded to a multiple of the ranks
    fits = max(1, budget // max(lengths))
    k = max(d for d in range(1, rows + 1) if rows % d == 0 and d <= fits)
    return budget, k * max(lengths)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from agl.learn.transitions import Transition
    from agl_trainer.chat_format import render_prompt
    from agl_trainer.engines.embedded import Engine, GenerationRequest
    from agl_trainer.examples.calculator import CALCULATOR, first_turn, train_tasks
    from agl_trainer.models import load_model, resolve_model
    from agl_trainer.policy.trainer import PolicyConfig, wrap_lora
    from agl_trainer.verl.backend import VerlPolicy

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.perf_counter()
    model_path = resolve_model(args.model)
    config = PolicyConfig(lr=args.lr)
    model, tokenizer = load_model(model_path, device=device)
    model = wrap_lora(model, config)  # the engine serves the adapter verl trains
    model.eval()
    engine = Engine(model, tokenizer, max_batch=args.tasks * args.group).start()
    print(f"model {model_path} on {device} ({time.perf_counter() - t0:.1f} s); engine up")

    t1 = time.perf_counter()
    policy = VerlPolicy(model_path, config, device=device, pad_id=engine.pad_id)
    print(
        f"verl {policy.verl_version} actor up in {time.perf_counter() - t1:.1f} s: profile {policy.profile}, "
        f"{policy.workers} worker(s)"
    )
    # colocation's starting point: the trainer's state in host memory while the engine generates
    policy.to_host()
    tasks = train_tasks()
    steps: list[dict[str, Any]] = []
    try:
        for step in range(args.steps):
            chosen = tasks[step * args.tasks : (step + 1) * args.tasks]
            r0 = time.perf_counter()
            transitions: list[Transition] = []
            rewards_all: list[float] = []
            generated = 0
            for k, task in enumerate(chosen):
                prompt = render_prompt(tokenizer, first_turn(task["question"]), [CALCULATOR])
                prompt_ids = list(tokenizer(prompt, add_special_tokens=False).input_ids)
                requests = [
                    GenerationRequest(
                        prompt_ids,
                        max_tokens=max(1, args.max_tokens - i),
                        temperature=0.7,
                        seed=1000 * step + 10 * k + i,
                    )
                    for i in range(args.group)
                ]
                results = engine.generate_many(requests)
                rewards = _rewards([r.text for r in results], task["answer"], [len(r.token_ids) for r in results])
                rewards_all += rewards
                for i, (result, advantage) in enumerate(zip(results, _advantages(rewards), strict=True)):
                    generated += len(result.token_ids)
                    transitions.append(
                        Transition(
                            rollout_id=f"s{step}-t{k}-r{i}",
                            task_id=f"s{step}-t{k}",
                            attempt_id="a0",
                            seq=0,
                            agent_name="solver",
                            prompt_ids=prompt_ids,
                            response_ids=list(result.token_ids),
                            response_mask=[1] * len(result.token_ids),
                            logprobs=list(result.logprobs),  # the engine's: the behaviour policy
                            model_version=step,
                            call_ids=[f"c{step}-{k}-{i}"],
                            advantage=advantage,
                            temperature=0.7,
                        )
                    )
            rollout_s = time.perf_counter() - r0

            u0 = time.perf_counter()
            policy.to_device()
            policy.peak_memory(reset=True)  # the peak of this turn: the moved state, the update, the export
            stats = policy.update(transitions)
            peaks = policy.peak_memory()
            with engine.lock:  # no generation while the weights change
                policy.load_into(model)
                engine.weights_changed()
            policy.to_host()
            update_s = time.perf_counter() - u0
            budget, used = _micro_batch_tokens(policy, transitions)
            row = {
                "step": step,
                "transitions": len(transitions),
                "reward_mean": statistics.fmean(rewards_all),
                "generated_tokens": generated,
                "rollout_s": round(rollout_s, 2),
                "update_s": round(update_s, 2),
                "loss": stats.loss,
                "grad_norm": stats.grad_norm,
                "ratio_mean": stats.ratio_mean,
                "tokens": stats.tokens,
                "micro_batches": stats.micro_batches,
                "skipped_zero_advantage": stats.skipped_zero_advantage,
                "peaks": peaks,
                "token_budget": budget,
                "micro_batch_tokens": used,
            }
            steps.append(row)
            print(
                f"step {step}: {len(transitions)} transitions, reward {row['reward_mean']:.3f}, rollout "
                f"{rollout_s:.1f} s ({generated} tokens), turn {update_s:.1f} s: loss {stats.loss:.4f}, grad norm "
                f"{stats.grad_norm:.4f}, ratio {stats.ratio_mean:.4f}, {stats.tokens} tokens in "
                f"{stats.micro_batches} micro-batch(es)"
            )
        moves = policy.moves()
    finally:
        policy.close()
        engine.close()
    return _summary(model_path, policy, steps, moves, device)


def _summary(model_path: Path, policy: Any, steps: list[dict[str, Any]], moves: list[Any], device: str) -> dict:
    from agl_trainer.plan.memory import CUDA_CONTEXT_GIB

    summary: dict[str, Any] = {"device": device, "steps": steps, "moves": moves}
    print(f"moves of rank 0 ({len(moves)}):")
    for move in moves:
        print(
            f"  to {move.get('device')}: allocated {move.get('allocated', 0) / GIB:.3f} GiB, reserved "
            f"{move.get('reserved', 0) / GIB:.3f} GiB{', cache emptied' if move.get('emptied_cache') else ''}"
        )
    for step in steps:
        at_budget = _estimate(model_path, policy, step["token_budget"])
        at_batch = _estimate(model_path, policy, step["micro_batch_tokens"])
        step["estimate_gib"] = {"at_budget": at_budget, "at_micro_batch": at_batch}
        # what the allocator sees: the estimate without the CUDA context (and, for `allocated`, without the slack)
        live = at_batch["total"] - at_batch.get("cuda_context_and_slack", 0.0)
        with_slack = at_batch["total"] - (CUDA_CONTEXT_GIB if device == "cuda" else 0.0)
        print(
            f"step {step['step']}: estimate {at_batch['total']:.3f} GiB at its largest micro-batch "
            f"({step['micro_batch_tokens']} positions; {live:.3f} GiB live, {with_slack:.3f} GiB with the allocator's "
            f"slack), {at_budget['total']:.3f} GiB at the budget of {step['token_budget']} tokens (what the plan checks)"
        )
        for rank, peak in enumerate(step["peaks"]):
            if device == "cpu":  # the worker's resident high-water mark, less what it held before loading the model
                measured = (peak.get("allocated", 0) - peak.get("before_model", 0)) / GIB
                print(
                    f"  rank {rank}: peak {measured:.3f} GiB resident (high-water mark less the process before the "
                    f"model) = {measured / live:.2f} x the estimate"
                )
            else:
                measured = peak.get("allocated", 0) / GIB
                reserved = peak.get("reserved", 0) / GIB
                print(
                    f"  rank {rank}: peak {measured:.3f} GiB allocated = {measured / live:.2f} x the live estimate; "
                    f"{reserved:.3f} GiB reserved = {reserved / with_slack:.2f} x the estimate with slack"
                )
            step.setdefault("peak_gib", []).append(round(measured, 3))
    if steps:
        print("estimate parts (GiB) at the last micro-batch:", json.dumps(steps[-1]["estimate_gib"]["at_micro_batch"]))
    return summary


def verdict(summary: dict[str, Any], steps: int) -> list[str]:
    problems = []
    rows = summary["steps"]
    if len(rows) != steps:
        problems.append(f"{len(rows)} of {steps} steps ran")
    for row in rows:
        if not row["tokens"] or not math.isfinite(float(row["grad_norm"])) or not math.isfinite(float(row["loss"])):
            problems.append(f"step {row['step']}: no update (tokens {row['tokens']}, grad norm {row['grad_norm']})")
    devices = [m.get("device") for m in summary["moves"]]
    turns = sum(1 for a, b in itertools.pairwise(devices) if (a, b) == ("device", "cpu"))
    if turns < steps or devices[-1:] != ["cpu"]:
        problems.append(f"moves {devices}: expected a move to the device and back to the host per step")
    return problems


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--model", default="bundled")
    parser.add_argument("--json", type=Path, help="write the summary (steps, peaks, estimates, moves) here")
    args = parser.parse_args(argv)
    summary = run(args)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    problems = verdict(summary, args.steps)
    for problem in problems:
        print("FAIL:", problem)
    if not problems:
        print(f"OK: {args.steps} colocated verl update(s) on {summary['device']}, moves logged")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
