"""One path from options to a training config, for `agl train`, `agl bench train`, option files and recipes.

The flags are declared once here (`SPECS`): their defaults are read from `TrainConfig` / `PolicyConfig`, their
choices from the registries that define them (`agl.learn.credit.STRATEGIES`), so help texts cannot drift from the code.
An option file (TOML or JSON) holds the same keys, as does a recipe; `build_config` turns the merged options into
the config, refusing keys nothing knows with the list of those it does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

import click
import tomllib

F = TypeVar("F", bound=Callable[..., Any])


def _strategies() -> list[str]:
    from agl.learn.credit import STRATEGIES

    return sorted(STRATEGIES)


@dataclass(frozen=True)
class Spec:
    """One command-line option of a training config field."""

    key: str  # the TrainConfig / PolicyConfig field it sets (or a pseudo-key handled by build_config)
    help: str
    flag: str | None = None  # default: --key-with-dashes
    choices: Callable[[], Sequence[str]] | None = None
    is_flag: bool = False
    type: type | None = None  # default: the field's own (from its default value)

    @property
    def option(self) -> str:
        return self.flag or "--" + self.key.replace("_", "-")


SPECS: dict[str, Spec] = {
    s.key: s
    for s in (
        Spec("model", "Local Hugging Face model folder, or 'bundled'."),
        Spec("run_dir", "Where the store, checkpoints, metrics and plot go.", type=str),
        Spec("steps", "Policy updates."),
        Spec("tasks_per_step", "Tasks per step."),
        Spec("group_size", "Rollouts per task (the GRPO group)."),
        Spec("eval_every", "Evaluate every k steps."),
        Spec("strategy", "Credit assignment.", choices=_strategies),
        Spec(
            "train_agents",
            "Agents whose calls are trained: names or glob patterns, e.g. writer,'*Researcher' "
            "(else AGL_TRAIN_AGENTS, else all).",
            flag="--agents",
            type=str,
        ),
        Spec(
            "per_agent_policies",
            "One LoRA policy per selected agent on the shared base model (the others run on the base model).",
            is_flag=True,
        ),
        Spec(
            "engine_url",
            "Generate with an engine in another process (agl engine, vLLM with runtime LoRA) serving the same model.",
            type=str,
        ),
        Spec(
            "engine",
            "Generate with agl's embedded engine, or a vLLM server agl starts from its own environment (make vllm).",
            choices=lambda: ["embedded", "vllm"],
        ),
        Spec(
            "vllm_python",
            "Python of the environment vLLM runs from (else AGL_VLLM_PYTHON, else .venv-vllm here or in a parent).",
            type=str,
        ),
        Spec(
            "trainer",
            "Who runs the policy update: agl's own trainer, or verl's PPO actor worker on Ray (pip install "
            "'agl-trainer[verl]'); credit assignment, AIR and agent selection are agl's either way.",
            choices=lambda: ["agl", "verl"],
        ),
        Spec(
            "trainer_workers",
            "verl: data-parallel ranks (FSDP2) of the update; default: every GPU the plan gives the trainer, on "
            "every node (1 on a CPU).",
            type=int,
        ),
        Spec(
            "ray_address",
            "verl: join this Ray cluster (multi-node) and plan for its nodes and GPUs (with --plan too); default: a "
            "local Ray agl starts.",
            type=str,
        ),
        Spec(
            "checkpoint_dir",
            "Where checkpoints go (default: RUN_DIR/checkpoints); with --ray-address, a folder every node mounts.",
            type=str,
        ),
        Spec(
            "rollout_gpus",
            "GPUs of each node kept for vLLM (--engine vllm); 0: vLLM shares every GPU with the trainer, asleep "
            "during updates.",
        ),
        Spec(
            "headroom_gib",
            "GiB of each GPU's usable memory (0.92 of it) the plan's estimate of the update leaves free (default 3: "
            "the estimate is checked only on a CPU, in fp32 without flash-attn; 0 fills what is usable).",
        ),
        Spec(
            "log_to",
            "Experiment trackers that also get the metrics, curve and eval samples: mlflow, tensorboard, wandb "
            "(comma-separated; each an optional extra: pip install 'agl-trainer[trackers]').",
            type=str,
        ),
        Spec("lr", "Learning rate."),
        Spec("full_finetune", "Train all weights instead of a LoRA adapter.", is_flag=True),
        Spec("kl_coef", "KL penalty to the base model (LoRA only).", flag="--kl"),
        Spec(
            "is_cap",
            "Off-policy correction: recompute π_old before each update and weight each token by π_old / the "
            "engine's sampling policy, truncated at this cap (with either trainer). Unset: no correction.",
            type=float,
        ),
        Spec(
            "is_mode",
            "With --is-cap: truncate each token's weight (tis), or leave out a transition whose weights stray past "
            "the cap (mis).",
            choices=lambda: ["tis", "mis"],
        ),
        Spec(
            "max_staleness",
            "Rollouts of the next K steps run while a step updates; a call sampled by a policy more than K versions "
            "older than the one updated is dropped (counted). 0: rollouts, then the update.",
        ),
        Spec("workers", "Worker processes."),
        Spec(
            "rollout_workers",
            "With --ray-address: this many rollout workers spread over the Ray cluster's nodes (restarted by Ray,"
            " stopped with the run) instead of --workers on this machine.",
        ),
        Spec("concurrency", "Rollouts at once per worker."),
        Spec("device", "cpu, cuda, ... or auto."),
        Spec(
            "temperature",
            "Sampling temperature of training rollouts: every training call of a trained agent is sampled at it,"
            " without top-p, top-k or penalties, whatever the agent asks (the trainer owns the sampling).",
        ),
        Spec(
            "keep_agent_sampling",
            "Send the trained agents' own sampling instead (their greedy or truncated calls are stored not trainable).",
            is_flag=True,
        ),
        Spec("eval_temperature", "Decoding of evaluation rollouts (0: greedy; unset: the --temperature).", type=float),
        Spec("seed", "Random seed of task order and sampling."),
        Spec("resume", "Continue from the run directory's latest checkpoint.", is_flag=True),
    )
}


# What the keys without a flag of their own mean: option files and recipes set them (the reference lists both)
FILE_ONLY_KEYS: dict[str, str] = {
    "agent": "The agent to train, `module:function` or `path/file.py:function` (the command's AGENT wins).",
    "train_tasks": "Training tasks: a list of task inputs, or a JSONL file's path (--tasks).",
    "eval_tasks": "Held-out tasks: a list of task inputs, or a JSONL file's path (--eval-tasks).",
    "air": "Automatic intermediate rewards (AIR) from tool-call status.",
    "checkpoint_every": "Checkpoint every k steps (and after the last).",
    "clip_low": "PPO clip range below 1 of the ratio π_θ / π_old.",
    "clip_high": "PPO clip range above 1 (asymmetric: a higher cap keeps exploring tokens trainable).",
    "gamma": "Discount of later rewards in credit assignment (1: none).",
    "lora": "Train a LoRA adapter (false: every weight, as --full-finetune).",
    "lora_rank": "LoRA rank.",
    "lora_alpha": "LoRA scaling numerator (the update is scaled by alpha / rank).",
    "lora_targets": "The modules LoRA adapts (their names in the model).",
    "max_attempts": "Attempts per rollout before it fails (a crashed or timed-out attempt is retried).",
    "max_batch": "The embedded engine's largest generation batch.",
    "max_grad_norm": "Gradients are clipped to this norm.",
    "max_transition_tokens": "Transitions longer than this (prompt + response) are left out, counted.",
    "merge_prefixes": "Merge a chat's consecutive calls into one transition (the environment's tokens masked).",
    "micro_batch_tokens": "Sequence tokens per forward/backward pass; gradients accumulate over passes.",
    "rollout_timeout_s": "Seconds one attempt may run before the server fails it.",
    "success_threshold": "A final reward at or above this counts as a success (train success rate, accuracy).",
    "verl_set": "verl settings under actor_rollout_ref as KEY=VALUE strings, checked by verl (--verl-set).",
    "weight_decay": "AdamW weight decay.",
}


def _dataclass_defaults() -> dict[str, Any]:
    from agl_trainer.config import PolicyConfig, TrainConfig

    out: dict[str, Any] = {}
    for cls in (TrainConfig, PolicyConfig):
        for f in fields(cls):
            if f.default is not MISSING:
                out[f.name] = f.default
            elif f.default_factory is not MISSING:
                out[f.name] = f.default_factory()
    out["full_finetune"] = not out["lora"]
    return out


def known_keys() -> frozenset[str]:
    """Every key an option file or recipe may hold: the fields of TrainConfig (the policy's as flat keys) and of
    PolicyConfig, and `full_finetune`."""
    from agl_trainer.config import PolicyConfig, TrainConfig

    names = {f.name for f in fields(TrainConfig)} | {f.name for f in fields(PolicyConfig)}
    return frozenset(names - {"policy"}) | {"full_finetune"}


def click_options(*keys: str, defaults: Mapping[str, Any] | None = None) -> Callable[[F], F]:
    """Click options for the named keys, in that order. Each defaults to None (unset: the option file's value,
    else the config's default, which the help shows). `defaults` overrides what the help shows (a recipe's)."""
    shown = {**_dataclass_defaults(), **(defaults or {})}

    def decorate(fn: F) -> F:
        for key in reversed(keys):
            spec = SPECS[key]
            default = shown.get(key)
            help_text = spec.help
            if not spec.is_flag and default not in (None, (), []):
                help_text += f"  [default: {default}]"
            kwargs: dict[str, Any] = {"default": None, "help": help_text}
            if spec.is_flag:
                kwargs["is_flag"] = True
            elif spec.choices is not None:
                kwargs["type"] = click.Choice(list(spec.choices()))
            else:
                kwargs["type"] = spec.type or (type(default) if default is not None else str)
            fn = click.option(spec.option, key, **kwargs)(fn)
        return fn

    return decorate


def read_option_file(path: str | Path) -> dict[str, Any]:
    """The options of a TOML or JSON file (keys with dashes or underscores), checked to be a table of options."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"option file {file} does not exist")
    try:
        text = file.read_text()
        data = tomllib.loads(text) if file.suffix == ".toml" else json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"option file {file} is not valid {file.suffix.lstrip('.').upper() or 'JSON'}: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"option file {file} must hold a table/object of options")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def merge(*layers: Mapping[str, Any] | None) -> dict[str, Any]:
    """Later layers win; None values (flags not given) leave earlier ones in place."""
    out: dict[str, Any] = {}
    for layer in layers:
        out.update({k: v for k, v in (layer or {}).items() if v is not None})
    return out


def unknown_keys(keys: Iterable[str]) -> list[str]:
    return sorted(set(keys) - known_keys())


def build_config(agent: str, options: Mapping[str, Any], *, where: str = "the options") -> Any:
    """The `TrainConfig` of `agent` with `options` (flags, option file, recipe merged): PolicyConfig fields go to
    the policy, `full_finetune` turns LoRA off. Unknown keys are a ValueError naming them and the known ones."""
    from agl_trainer.config import PolicyConfig, TrainConfig

    options = dict(options)
    options.pop("agent", None)
    missing = [k for k in ("train_tasks", "eval_tasks", "run_dir") if k not in options]
    if missing:
        raise ValueError(f"{where} give no {', '.join(missing)}")
    unknown = unknown_keys(options)
    if unknown:
        raise ValueError(
            f"unknown option(s) in {where}: {', '.join(unknown)} (known: {', '.join(sorted(known_keys()))})"
        )
    policy_keys = {f.name for f in fields(PolicyConfig)}
    policy = {k: options.pop(k) for k in list(options) if k in policy_keys}
    if options.pop("full_finetune", False):
        policy["lora"] = False
    if "lora_targets" in policy:
        policy["lora_targets"] = tuple(policy["lora_targets"])
    if "verl_set" in options:
        value = options["verl_set"]
        options["verl_set"] = (value,) if isinstance(value, str) else tuple(str(v) for v in value)
    if "run_dir" in options:
        options["run_dir"] = Path(str(options["run_dir"]))
    if options.get("checkpoint_dir") is not None:
        options["checkpoint_dir"] = Path(str(options["checkpoint_dir"]))
    return TrainConfig(agent=agent, policy=PolicyConfig(**policy), **options)
