"""The settings agl hands verl's actor worker: one function for the run and for `agl train --plan`.

Two profiles. On a CPU (where verl ships no platform of its own, agl_trainer.verl.platform) everything is fp32,
padded batches with `sdpa` attention, no gradient checkpointing: what measured fastest on 2 cores. On CUDA, what
verl's own GPU recipes do, since the CPU's choices run out of memory on a GPU's first update (issue #28):

- bf16 compute with fp32 master weights (FSDP mixed precision: `param_dtype` bf16, `reduce_dtype` fp32, the
  sharded parameters fp32), TF32 matmuls for what stays fp32; with LoRA the frozen base is loaded in bf16 (verl's
  `model_dtype`: it is never updated, so fp32 would only double its memory) and the adapter stays fp32
  (agl_trainer.verl.adapter says how);
- gradient checkpointing;
- remove-padding (sequences packed without pad tokens) with `flash_attention_2` when flash-attn imports, else
  `sdpa` on padded batches, with a warning that says what to install;
- a token budget per GPU (`ppo_max_token_len_per_gpu`, log-prob passes alike) that the plan derives from the
  memory estimate (agl_trainer.plan.memory).

`overrides` (`--verl-set key=value`) are dotted keys under `actor_rollout_ref`, applied last; `validate` checks the
result with verl's own config dataclasses.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agl_trainer.config import PolicyConfig
from agl_trainer.verl.loss import NO_DUAL_CLIP


@dataclass(frozen=True)
class VerlProfile:
    device: str  # "cpu" | "cuda"
    dtype: str  # the compute dtype: "fp32" (CPU) | "bf16" (CUDA)
    gradient_checkpointing: bool
    remove_padding: bool
    attention: str  # "sdpa" | "flash_attention_2"
    token_budget: int  # tokens per micro-batch and GPU (forward/backward and log-prob passes)
    # the dtype verl loads the model in (`model_dtype`): fp32 master weights when every weight trains, the compute
    # dtype for a LoRA policy's frozen base (its adapter is fp32 either way)
    weights_dtype: str = "fp32"

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"


def flash_attention_available() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def cpu_profile(policy: PolicyConfig) -> VerlProfile:
    return VerlProfile("cpu", "fp32", False, False, "sdpa", int(policy.micro_batch_tokens))


def cuda_profile(token_budget: int, *, lora: bool, flash_attention: bool | None = None) -> VerlProfile:
    """The CUDA profile: bf16 + fp32 master weights (a LoRA policy's frozen base in bf16), gradient checkpointing,
    remove-padding with flash-attn when it is installed (`flash_attention`: None asks this machine)."""
    flash = flash_attention_available() if flash_attention is None else flash_attention
    weights = "bf16" if lora else "fp32"
    return VerlProfile(
        "cuda", "bf16", True, flash, "flash_attention_2" if flash else "sdpa", int(token_budget), weights
    )


def hsdp_shard_size(ranks_per_node: Sequence[int]) -> int:
    """verl's `fsdp_size` for the trainer's ranks: with the same number on several nodes, that number (HSDP: each
    layer sharded over one node's GPUs and replicated across nodes, so its all-gathers stay inside the node; verl
    numbers ranks node by node, and its mesh's inner dimension is the shard group); else -1, one mesh over every
    rank (one node, one rank a node, or nodes of different sizes). `--verl-set actor.fsdp_config.fsdp_size=-1`
    shards across nodes anyway."""
    nodes = [n for n in ranks_per_node if n > 0]
    return nodes[0] if len(nodes) > 1 and len(set(nodes)) == 1 and nodes[0] > 1 else -1


def actor_settings(
    model_path: str | os.PathLike[str],
    policy: PolicyConfig,
    profile: VerlProfile,
    *,
    seed: int = 42,
    initial_adapter: str | os.PathLike[str] | None = None,
    ranks_per_node: Sequence[int] = (),
) -> dict[str, Any]:
    """agl's choices for verl's `actor_rollout_ref`, as dotted keys (the rest stays at verl's defaults)."""
    tokens = profile.token_budget
    bf16 = profile.dtype == "bf16"
    return {
        "model.path": str(Path(model_path)),
        "model.trust_remote_code": False,
        "model.use_remove_padding": profile.remove_padding,  # packed sequences need flash-attn's varlen kernels
        "model.enable_gradient_checkpointing": profile.gradient_checkpointing,
        "model.use_fused_kernels": False,  # agl's loss needs the token log-probs at each sequence's own temperature
        "model.override_config": {"attn_implementation": profile.attention},
        "model.lora_rank": policy.lora_rank if policy.lora else 0,
        "model.lora_alpha": policy.lora_alpha,
        "model.target_modules": list(policy.lora_targets),
        "model.lora_adapter_path": str(initial_adapter) if initial_adapter else None,
        "actor.strategy": "fsdp2",
        "actor.use_torch_compile": False,
        "actor.fsdp_config.use_torch_compile": False,
        # the trained parameters stay fp32 (the master weights); FSDP casts to param_dtype to compute. A LoRA
        # policy's frozen base is loaded in the profile's weights dtype (bf16 on CUDA)
        "actor.fsdp_config.model_dtype": profile.weights_dtype if policy.lora else "fp32",
        "actor.fsdp_config.mixed_precision": {
            "param_dtype": "bf16" if bf16 else "fp32",
            "reduce_dtype": "fp32",
            "buffer_dtype": "fp32",
        },
        "actor.fsdp_config.seed": seed,
        "actor.fsdp_config.fsdp_size": hsdp_shard_size(ranks_per_node),
        "actor.optim.lr": policy.lr,
        "actor.optim.weight_decay": policy.weight_decay,
        "actor.optim.betas": [0.9, 0.999],  # torch's AdamW defaults, as agl's trainer
        "actor.optim.clip_grad": policy.max_grad_norm,
        "actor.optim.lr_scheduler_type": "constant",
        "actor.optim.lr_warmup_steps": 0,
        "actor.grad_clip": policy.max_grad_norm,
        "actor.clip_ratio": policy.clip_low,
        "actor.clip_ratio_low": policy.clip_low,
        "actor.clip_ratio_high": policy.clip_high,
        "actor.clip_ratio_c": NO_DUAL_CLIP,
        "actor.loss_agg_mode": "seq-mean-token-mean",
        "actor.policy_loss.loss_mode": "vanilla",
        "actor.entropy_coeff": 0.0,
        "actor.calculate_entropy": False,
        "actor.use_kl_loss": False,  # the KL term is added by agl_ppo_loss, weighted per transition
        "actor.kl_loss_coef": policy.kl_coef,
        "actor.kl_loss_type": "low_var_kl",
        "actor.ppo_epochs": 1,
        "actor.shuffle": False,
        "actor.use_dynamic_bsz": True,  # micro-batches by token budget, like agl's micro_batch_tokens
        "actor.ppo_max_token_len_per_gpu": tokens,
        "actor.checkpoint.save_contents": ["model", "optimizer", "extra"],
        "actor.checkpoint.load_contents": ["model", "optimizer", "extra"],
        "actor.checkpoint.save_lora_only": bool(policy.lora),
        "rollout.n": 1,
        "rollout.log_prob_use_dynamic_bsz": True,
        "rollout.log_prob_max_token_len_per_gpu": tokens,
        "ref.log_prob_use_dynamic_bsz": True,
        "ref.log_prob_max_token_len_per_gpu": tokens,
    }


def parse_overrides(items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """`key=value` strings (`--verl-set`) as dotted keys under `actor_rollout_ref` with YAML-typed values
    (`actor.optim.lr=1e-6`, `actor.optim.betas=[0.9,0.95]`); a leading `actor_rollout_ref.` is dropped."""
    import yaml

    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip().removeprefix("actor_rollout_ref.")
        if not sep or not key or any(not part for part in key.split(".")):
            raise ValueError(f"--verl-set {item!r}: expected KEY=VALUE with a dotted key, e.g. actor.optim.lr=1e-6")
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError as exc:
            raise ValueError(f"--verl-set {item!r}: the value is not valid YAML ({exc})") from None
        out[key] = _number(value)
    return out


def _number(value: Any) -> Any:
    """YAML 1.1 reads `1e-6` (no dot) as a string: a number written that way is a number."""
    if isinstance(value, str):
        for kind in (int, float):
            try:
                return kind(value)
            except ValueError:
                pass
    return value


def root_config(settings: Mapping[str, Any], overrides: Mapping[str, Any] | None = None) -> Any:
    """verl's config (OmegaConf): its generated PPO trainer defaults for `actor_rollout_ref` (and the profiler
    section its workers read), then `settings`, then `overrides`. Needs verl installed."""
    import verl
    from omegaconf import OmegaConf

    defaults = Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    full = OmegaConf.load(defaults)
    root = OmegaConf.create({"actor_rollout_ref": full.actor_rollout_ref, "global_profiler": full.global_profiler})
    known = OmegaConf.to_container(full.actor_rollout_ref)
    unknown = [k for k in (overrides or {}) if not _has_path(known, k)]
    if unknown:
        raise ValueError(
            f"--verl-set names settings verl's actor_rollout_ref does not have: {', '.join(sorted(unknown))} "
            "(see verl's trainer/config/_generated_ppo_trainer.yaml)"
        )
    # verl's dataclasses check some values, not every type: a string where verl has a number would pass them
    wrong = [
        f"{k}={v!r} (verl's default is {type(d).__name__} {d!r})"
        for k, v in (overrides or {}).items()
        if (d := _at_path(known, k)) is not None and v is not None and not _same_kind(v, d)
    ]
    if wrong:
        raise ValueError(f"--verl-set gives values of the wrong type: {'; '.join(wrong)}")
    for key, value in {**settings, **(overrides or {})}.items():
        OmegaConf.update(root, f"actor_rollout_ref.{key}", value, merge=False, force_add=True)
    OmegaConf.resolve(root)
    return root


def _has_path(tree: Any, dotted: str) -> bool:
    node = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _at_path(tree: Any, dotted: str) -> Any:
    node = tree
    for part in dotted.split("."):
        node = node[part]
    return node


def _same_kind(value: Any, default: Any) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, (int, float)):
        return isinstance(value, (int, float))
    if isinstance(default, str) and isinstance(value, (int, float)):
        return True  # verl writes some numbers as strings (`"1e-6"`); YAML reads them back as numbers
    return isinstance(value, type(default))


def validate(root: Any, *, load_tokenizer: bool) -> None:
    """Build verl's own config dataclasses from `root` as its actor worker does when it starts (the model's, then
    the actor's: agl runs the role "actor" alone): a value of the wrong type or out of range is a ValueError naming
    the section. `load_tokenizer`: whether the model folder has tokenizer files to load (a plan may have none)."""
    from omegaconf import OmegaConf, open_dict
    from verl.utils.config import omega_conf_to_dataclass

    arr: Any = OmegaConf.create(OmegaConf.to_container(root.actor_rollout_ref, resolve=True))
    problems = []
    with open_dict(arr.model):
        arr.model.load_tokenizer = load_tokenizer
    for section in ("model", "actor"):
        try:
            omega_conf_to_dataclass(arr[section])
        except Exception as exc:
            problems.append(f"actor_rollout_ref.{section}: {type(exc).__name__}: {exc}".replace("\n", " "))
    if problems:
        raise ValueError("verl refuses this configuration: " + "; ".join(problems))
