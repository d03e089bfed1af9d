"""What a train step records in metrics.jsonl beyond its counts (resources, overlap, LLM-call use, memory) and the
line it prints. Nothing is silently zero: what was left out is counted and shown."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agl.common.trainable import TrainableRollout
from agl.learn.credit import CreditStats
from agl.learn.transitions import BuildStats
from agl_trainer.policy.memory import peak_resident_bytes, resident_bytes

if TYPE_CHECKING:
    from agl_trainer.backends import UpdateStats


def resource_fields(generated_tokens: int, rollout_s: float) -> dict[str, float]:
    """A train step's resource figures: `gen_tokens_per_s` (tokens generated during the step's rollouts per
    second of them) and, when this process uses CUDA, `gpu_peak_gib` (its peak allocated GPU memory so far)."""
    import torch

    out: dict[str, float] = {}
    if rollout_s > 0:
        out["gen_tokens_per_s"] = generated_tokens / rollout_s
    peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0  # 0 until CUDA is used
    if peak > 0:
        out["gpu_peak_gib"] = peak / 2**30
    return out


def overlap_fields(
    step_s: float, rollout_wait_s: float, update_s: float, usage_before: dict[str, Any], usage: dict[str, Any]
) -> dict[str, float]:
    """How a train step used the engine and the trainer, from its start to its new version's publication:
    `step_s`; `rollout_wait_s` (waiting for its rollouts); `engine_busy` (the fraction of the step with at least one
    LLM call in flight at the proxy, whatever step's rollout made it); `trainer_busy` (the update's fraction);
    `tokens_per_s` (tokens the engine generated per second of the step)."""
    if step_s <= 0:
        return {"step_s": step_s, "rollout_wait_s": rollout_wait_s}
    return {
        "step_s": step_s,
        "rollout_wait_s": rollout_wait_s,
        "engine_busy": min(1.0, (usage["busy_s"] - usage_before["busy_s"]) / step_s),
        "trainer_busy": min(1.0, update_s / step_s),
        "tokens_per_s": (usage["completion_tokens"] - usage_before["completion_tokens"]) / step_s,
    }


def llm_call_counts(rollouts: Sequence[TrainableRollout]) -> dict[str, int]:
    """What a step's rollouts did with their LLM calls: sent them elsewhere than agl (`bypassed_llm_calls`, the
    runner's count), only there (`rollouts_only_bypassing`: calls made, none recorded), or made none at all."""
    return {
        "bypassed_llm_calls": sum(r.rollout.bypassed_llm_calls for r in rollouts),
        "rollouts_only_bypassing": sum(1 for r in rollouts if r.rollout.bypassed_llm_calls and not r.llm_calls),
        "rollouts_without_llm_calls": sum(1 for r in rollouts if not r.rollout.bypassed_llm_calls and not r.llm_calls),
    }


def prefix_cache_mb(inference: Any) -> float:
    """What the embedded engine's prefix cache (bounded by bytes) holds now; 0 for other engines."""
    cache = getattr(inference, "prefix_cache", None)
    return (cache.bytes if cache is not None else 0) / 2**20


def memory_fields(inference: Any) -> dict[str, float]:
    """This process's resident memory now and at its peak, and the engine's prefix cache."""
    return {
        "rss_gb": resident_bytes() / 2**30,
        "peak_rss_gb": peak_resident_bytes() / 2**30,
        "prefix_cache_mb": prefix_cache_mb(inference),
    }


def step_line(
    row: dict[str, Any],
    *,
    steps: int,
    dropped: int,
    update: UpdateStats,
    build: BuildStats,
    credit: CreditStats,
    llm_use: dict[str, int],
) -> str:
    """The line a train step prints: its metrics row, with the update's, the build's and credit's own figures."""
    return (
        f"step {row['step'] + 1:>3}/{steps}  reward {row['reward_mean']:.3f}  success {row['success_rate']:.2f}  "
        f"transitions {row['transitions']}  failed {row['failed']}  dropped {dropped}  "
        f"grad norm {update.grad_norm:.3f}  trained on {update.transitions - update.skipped_zero_advantage}  "
        f"rollouts {row['rollout_s']:.0f}s update {row['update_s']:.0f}s  memory {row['rss_gb']:.1f} GB "
        f"(peak {row['peak_rss_gb']:.1f}, prefix cache {row['prefix_cache_mb']:.0f} MB)"
        + _overlap_summary(row)
        + (f"  tasks with one rollout {credit.single_rollout_groups}" if credit.single_rollout_groups else "")
        + (f"  log-probs recomputed {update.recomputed_logprobs}" if update.recomputed_logprobs else "")
        + _importance_summary(update.extra)
        + (f"  ⚠ agent name lost {build.missed_attribution}" if build.missed_attribution else "")
        + (f"  ⚠ LLM calls that bypassed agl {llm_use['bypassed_llm_calls']}" if llm_use["bypassed_llm_calls"] else "")
        + (
            f"  rollouts without LLM calls {llm_use['rollouts_without_llm_calls']}"
            if llm_use["rollouts_without_llm_calls"]
            else ""
        )
    )


def _overlap_summary(row: dict[str, Any]) -> str:
    """The step line's part on overlap: how busy the engine and the trainer were, and the staleness trained on."""
    if "engine_busy" not in row:
        return ""
    out = f"  engine busy {row['engine_busy']:.0%} trainer {row['trainer_busy']:.0%}  {row['tokens_per_s']:.0f} tok/s"
    if row["max_staleness"]:
        out += "  staleness " + " ".join(f"{k}:{v}" for k, v in row["staleness"].items())
    return out


def _importance_summary(extra: dict[str, float]) -> str:
    """The step line's part on the off-policy correction's weights (empty when it is off)."""
    if "is_weight_mean" not in extra:
        return ""
    dropped = (
        f"masked {extra['is_masked_fraction']:.1%}"
        if "is_masked_fraction" in extra
        else f"truncated {extra.get('is_truncated_fraction', 0.0):.1%}"
    )
    return f"  IS weight mean {extra['is_weight_mean']:.3f} max {extra['is_weight_max']:.2f} {dropped}"


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


NO_SELECTED_CALL = "no trainable call of a selected agent"  # agl.learn.transitions' reason for such a rollout


def empty_rollouts_warning(llm_use: dict[str, int], dropped_rollouts: dict[str, int]) -> str | None:
    """Why some of a step's rollouts gave nothing to train on although they ran, with the likely causes; None when
    every rollout stored a call the run trains. Said once per run (the step line counts them at every step)."""
    empty = llm_use["rollouts_without_llm_calls"]
    unselected = dropped_rollouts.get(NO_SELECTED_CALL, 0)
    if not empty and not unselected:
        return None
    parts = []
    if empty:
        parts.append(
            f"{empty} rollout(s) stored no LLM call at all: an answer cache (agl worker turns DSPy's off; a cache of"
            " the app's own answers the same way), a client that reached the model without agl, or an agent that"
            " answered without the model"
        )
    if unselected:
        parts.append(
            f"{unselected} rollout(s) stored calls, none of them trainable and of a selected agent: unnamed agents"
            " (name them: `with agl.agent(...)`, LangGraph's `create_agent(name=...)`), agents outside --agents,"
            " or calls stored not trainable (`agl show ROLLOUT` says why)"
        )
    return "⚠ " + "; ".join(parts) + ". These rollouts train nothing."
