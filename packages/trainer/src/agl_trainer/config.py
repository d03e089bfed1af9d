"""What a training run is asked to do: `TrainConfig` (the run) and `PolicyConfig` (the update), plain data.

Kept apart from the modules that do the work so that reading a config's defaults (the CLI's help, option files,
recipes: agl_trainer.options) imports neither torch nor the trainer.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# the experiment trackers `--log-to` takes (agl_trainer.tracking.trackers writes to them)
TRACKERS = ("mlflow", "tensorboard", "wandb")


def parse_trackers(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """`"mlflow,tensorboard"` or a list → the tracker names, checked; None / "" → none."""
    if value is None:
        return ()
    names = value.split(",") if isinstance(value, str) else list(value)
    cleaned = tuple(dict.fromkeys(n.strip().lower() for n in names if n.strip()))
    unknown = [n for n in cleaned if n not in TRACKERS]
    if unknown:
        raise ValueError(f"unknown tracker(s) {', '.join(unknown)}: choose from {', '.join(TRACKERS)}")
    return cleaned


@dataclass
class PolicyConfig:
    lr: float = 2e-4
    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 0.0
    max_grad_norm: float = 1.0
    micro_batch_tokens: int = 16384  # sequence tokens per forward/backward pass; gradients accumulate over passes
    lora: bool = True
    lora_rank: int = 16
    lora_alpha: int = 32
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    weight_decay: float = 0.0
    # Off-policy correction (agl_trainer.policy.trainer): None keeps the objective above with π_old = the engine's
    # log-probs. A number recomputes π_old with the policy before the update and weights each token by
    # π_old / π_behaviour: truncated at this cap ("tis"), or the transition masked when the geometric mean of its
    # weights leaves [1/cap, cap] ("mis").
    is_cap: float | None = None
    is_mode: str = "tis"

    def __post_init__(self) -> None:
        if self.is_mode not in ("tis", "mis"):
            raise ValueError(f"is_mode must be 'tis' or 'mis', got {self.is_mode!r}")
        if self.is_cap is not None and not self.is_cap > 1.0:
            raise ValueError(f"is_cap must be above 1 (a weight of 1 is no correction), got {self.is_cap}")


@dataclass
class TrainConfig:
    agent: str  # `module:function` or `path/file.py:function`, decorated with @agl.rollout
    train_tasks: list[Any]
    eval_tasks: list[Any]
    run_dir: Path
    model: str = "bundled"
    device: str = "auto"
    steps: int = 20
    tasks_per_step: int = 8
    group_size: int = 4
    eval_every: int = 5
    strategy: str = "grpo"
    gamma: float = 1.0
    merge_prefixes: bool = False
    max_transition_tokens: int = 2048
    train_agents: str | None = None  # `writer,rewriter`; None: AGL_TRAIN_AGENTS, else every agent
    # one LoRA policy per selected agent on the shared base model; the other agents are served by the base model
    per_agent_policies: bool = False
    # an OpenAI-compatible engine in another process serving the same base model (`agl engine`, vLLM with runtime
    # LoRA loading): rollouts are generated there and each update's adapters are loaded into it; None: `engine`
    engine_url: str | None = None
    engine: str = "embedded"  # or "vllm": a vLLM server agl starts from its own environment (`make vllm`)
    vllm_python: str | None = None  # that environment's python; None: $AGL_VLLM_PYTHON, else .venv-vllm
    # who runs the policy update: "agl" (agl's own torch trainer, in this process) or "verl" (verl's PPO actor
    # worker, FSDP2 on Ray; agl_trainer.verl): LightningRL (transitions, credit, AIR, selection) is agl's either way
    trainer: str = "agl"
    # verl: data-parallel ranks (FSDP2). None: every GPU the run's plan gives the trainer (each node's GPUs, less
    # vLLM's own with rollout_gpus, over every node of the Ray cluster; shared by per-agent policies' actors), 1
    # without a plan (on a CPU); agl_trainer.plan.build.trainer_ranks, set to the number by run_setup.gpu_plan
    trainer_workers: int | None = None
    # verl: join this Ray cluster, and plan for its nodes and GPUs (agl_trainer.plan.cluster); None: a local Ray agl
    # starts and stops
    ray_address: str | None = None
    # on GPUs with --engine vllm: GPUs of each node kept for vLLM (0: vLLM shares every GPU with the trainer, in
    # sleep mode during updates; agl_trainer.plan.layout)
    rollout_gpus: int = 0
    # on GPUs: GiB of each GPU's usable memory the plan's estimate of the update leaves free (checked only on a CPU,
    # in fp32 without flash-attn, until a GPU measures it; agl_trainer.plan.build.fill_limit)
    headroom_gib: float = 3.0
    # where checkpoints go (default: <run_dir>/checkpoints); with verl on several nodes every rank writes its shards
    # there, so it must be a folder every node mounts at the same path
    checkpoint_dir: Path | None = None
    # verl settings under actor_rollout_ref as KEY=VALUE (`actor.optim.betas=[0.9,0.95]`), applied after agl's,
    # checked by verl's dataclasses (agl_trainer.verl.settings)
    verl_set: tuple[str, ...] = ()
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    # rollouts of later steps run while a step updates (agl_trainer.pipeline): a call sampled by a policy more than
    # this many versions older than the one being updated is never trained on. 0: rollouts, then the update
    max_staleness: int = 0
    workers: int = 2
    # with ray_address: this many rollout workers spread over the Ray cluster's nodes instead of `workers` here
    # (agl_trainer.run.worker_pool; 0: the workers run on this machine)
    rollout_workers: int = 0
    concurrency: int = 8
    max_batch: int = 16
    temperature: float = 1.0  # sampling temperature of training rollouts whose agent sets none
    # send the trained agents' own sampling (temperature, top-p, ...) instead of the run's: their greedy or
    # truncated calls are then stored not trainable (agl.server.run_sampling)
    keep_agent_sampling: bool = False
    eval_temperature: float | None = None  # decoding of evaluation rollouts; None: `temperature` (0: greedy)
    seed: int = 0
    success_threshold: float = 1.0
    air: bool = True
    checkpoint_every: int = 5
    rollout_timeout_s: float = 600.0
    max_attempts: int = 2
    resume: bool = False
    # experiment trackers that get the metrics rows, the curve and eval samples: "mlflow", "tensorboard", "wandb"
    log_to: tuple[str, ...] = ()

    def validate(self) -> None:
        problems = []
        if not self.train_tasks:
            problems.append("no training tasks")
        if not self.eval_tasks:
            problems.append("no evaluation tasks")
        for name in (
            "steps",
            "tasks_per_step",
            "group_size",
            "eval_every",
            "workers",
            "concurrency",
            "max_batch",
            "checkpoint_every",
            "max_attempts",
        ):
            if int(getattr(self, name)) < 1:
                problems.append(f"{name} must be ≥ 1, got {getattr(self, name)}")
        if ":" not in self.agent:
            problems.append(f"agent {self.agent!r} must look like 'module:function' or 'path/file.py:function'")
        if self.engine not in ("embedded", "vllm"):
            problems.append(f"engine must be 'embedded' or 'vllm', got {self.engine!r}")
        if self.trainer not in ("agl", "verl"):
            problems.append(f"trainer must be 'agl' or 'verl', got {self.trainer!r}")
        if self.trainer_workers is not None and int(self.trainer_workers) < 1:
            problems.append(f"trainer_workers must be ≥ 1, got {self.trainer_workers}")
        # ray_address serves verl's ranks, or the rollout workers spread over the cluster (rollout_workers)
        if self.trainer != "verl" and (
            self.trainer_workers not in (None, 1) or (self.ray_address and not self.rollout_workers)
        ):
            problems.append(
                "trainer_workers and ray_address are verl's: give them with trainer 'verl' (or ray_address with"
                " rollout_workers, for workers on the cluster)"
            )
        if self.trainer == "verl" and self.ray_address and self.checkpoint_dir is None:
            problems.append(
                "verl on a Ray cluster (ray_address) writes each rank's checkpoint shards on its own node: give "
                "checkpoint_dir, a folder every node mounts at the same path (--checkpoint-dir)"
            )
        if self.trainer != "verl" and self.verl_set:
            problems.append("verl_set changes verl's settings: give it with trainer 'verl'")
        if int(self.max_staleness) < 0:
            problems.append(f"max_staleness must be ≥ 0, got {self.max_staleness}")
        if int(self.rollout_gpus) < 0:
            problems.append(f"rollout_gpus must be ≥ 0, got {self.rollout_gpus}")
        if self.rollout_workers and not self.ray_address:
            problems.append("rollout_workers starts the workers on a Ray cluster: give ray_address too")
        if int(self.rollout_workers) < 0:
            problems.append(f"rollout_workers must be ≥ 0, got {self.rollout_workers}")
        if self.rollout_gpus and self.engine != "vllm":
            problems.append("rollout_gpus gives GPUs to vLLM: give it with engine 'vllm'")
        if self.engine_url and self.engine == "vllm":
            problems.append("engine_url attaches to a running engine: leave engine 'embedded' (or drop engine_url)")
        try:
            self.log_to = parse_trackers(self.log_to)
        except ValueError as exc:
            problems.append(str(exc))
        if self.per_agent_policies and not self.policy.lora:
            problems.append("per_agent_policies needs LoRA (each selected agent trains its own adapter)")
        if problems:
            raise ValueError("invalid training configuration: " + "; ".join(problems))
