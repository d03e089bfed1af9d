"""`agl train --plan`: everything a run would start, resolved without loading weights or starting a process.

The plan is one JSON object:

- `model`: the shape read from config.json (parameters, layers, vocabulary, family);
- `placement`: the layout (colocated or split, and why) and the trainer's GPUs on each node;
- `vllm`: each server's exact command line (`argv`) and the environment variables agl sets (`env`), one server per
  node, or one per data-parallel rank where LoRA needs it (`placement.vllm.servers_per_node`, `servers_why`);
- `verl`: the profile, agl's settings and the whole config handed to verl, validated by verl's dataclasses;
- `memory`: per GPU, each part of the update, each phase's total, `peak_gib_per_gpu` and `fits`, the headroom
  kept below the usable memory (`headroom_gib`, and why) and what the estimated phases may fill (`fill_limit_gib`);
- `warnings`: each with what to change; `fits` false comes with the knob that would make it fit (`refusal`).

A real run on CUDA writes the same object to `<run_dir>/plan.json` before it starts anything.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agl_trainer.config import TrainConfig
from agl_trainer.model_shape import ModelShape, read_shape
from agl_trainer.plan.hardware import Hardware
from agl_trainer.plan.layout import Layout, choose_layout, trainer_placement
from agl_trainer.plan.memory import CUDA_CONTEXT_GIB, VLLM_ASLEEP_GIB, UpdateSetup, logit_bytes, update_memory
from agl_trainer.plan.tool_parsers import tool_parser

USABLE_FRACTION = 0.92  # of a GPU's memory a plan may use: the rest absorbs what the estimate does not model
# kept free below that, on top, until the estimate is measured on a GPU; vLLM's own share is not an estimate
# (vLLM sizes its KV cache to fit it), so the phases it fills are held to the usable memory alone
DEFAULT_HEADROOM_GIB = TrainConfig.headroom_gib  # the config's default
HEADROOM_WHY = (
    "the update's estimate has been checked only against verl's worker on a CPU, in fp32 and without flash-attn; "
    "bf16, flash-attn's kernels and the CUDA allocator only a GPU measurement can confirm"
)
MAX_TOKEN_BUDGET = 65_536
BUDGET_STEP = 4096  # the token budgets a plan tries (verl's own recipes use 16k-32k per GPU, e.g. 24k)
ACROSS_NODES = "--verl-set actor.fsdp_config.fsdp_size=-1"
FLASH_ATTN_HINT = (
    "make gpu (.venv-gpu: torch 2.11 with the prebuilt flash-attn wheel verl pairs with it; see Running on GPUs): "
    "remove-padding then packs sequences without pad tokens"
)


@dataclasses.dataclass
class PlanRequest:
    config: TrainConfig
    hardware: Hardware
    rollout_gpus: int | None = None
    verl_overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    flash_attention: bool | None = None  # None: whether flash-attn imports here
    headroom_gib: float | None = None  # kept free below the usable memory; None: the config's (--headroom-gib)

    @property
    def headroom(self) -> float:
        return float(self.config.headroom_gib if self.headroom_gib is None else self.headroom_gib)


def usable_gib(hardware: Hardware) -> float:
    return USABLE_FRACTION * hardware.gpu_memory_gib


def fill_limit(req: PlanRequest) -> float:
    """What the estimated phases may fill on one GPU: the usable memory less the headroom; a headroom that is
    negative or leaves nothing is refused by its option's name."""
    usable = usable_gib(req.hardware)
    headroom = req.headroom
    if not 0 <= headroom < usable:  # NaN fails too
        raise ValueError(
            f"--headroom-gib {headroom:g} must be at least 0 and less than the {usable:.1f} GiB usable of a "
            f"{req.hardware.gpu_memory_gib:g} GiB GPU"
        )
    return usable - headroom


def shard_group(req: PlanRequest, ranks: int, ranks_per_node: Sequence[int]) -> int:
    """How many of the actor's `ranks` share one copy of its state: the `fsdp_size` the run gives verl (HSDP
    within a node on several equal nodes, agl_trainer.verl.settings.hsdp_shard_size; `--verl-set
    actor.fsdp_config.fsdp_size=N` wins), read as verl's `create_device_mesh` reads it (< 0 or ≥ the ranks: all)."""
    from agl_trainer.verl.settings import hsdp_shard_size

    if req.config.trainer != "verl":
        return 1
    # per-agent actors get no ranks_per_node from _verl: one mesh over each actor's ranks
    size = req.verl_overrides.get("actor.fsdp_config.fsdp_size")
    if size is None:
        size = hsdp_shard_size(ranks_per_node) if verl_actors(req.config) == 1 else -1
    size = int(size)
    return ranks if size < 0 or size >= ranks else size


def _shards_at(req: PlanRequest, ranks: int) -> int:
    """The shard group if the actor had `ranks` ranks, placed as the layout would place them."""
    if verl_actors(req.config) > 1:
        return shard_group(req, ranks, [])
    per_node = req.hardware.gpus_per_node - (req.rollout_gpus or 0)
    return shard_group(req, ranks, trainer_placement(ranks, req.hardware, per_node))


def _has_tokenizer(path: Path) -> bool:
    return (path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file()


def _template_renders_tools(path: Path) -> bool | None:
    """Whether the model's own chat template renders tools (`chat_format.supports_native_tools`' rule, read from
    chat_template.jinja or tokenizer_config.json), None: no tokenizer files to tell."""
    jinja = path / "chat_template.jinja"  # where transformers 5 saves it
    if jinja.is_file():
        return "tools" in jinja.read_text()
    config = path / "tokenizer_config.json"
    if not config.is_file():
        return None
    template = json.loads(config.read_text()).get("chat_template")
    if isinstance(template, list):  # named templates
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    return None if not isinstance(template, str) else "tools" in template


def _assumptions(req: PlanRequest, shape: ModelShape, tokens: int, ranks: int, shards: int) -> dict[str, Any]:
    """What the update's estimate takes for granted, as the printed plan says it."""
    setup = _update_setup(req, shape, tokens, ranks, shards)
    lora = req.config.policy.lora
    return {
        "weights": ("the frozen base in bf16, the LoRA adapter in fp32" if lora else "fp32 master weights")
        + ", computed in bf16",
        "logits_path": setup.logits_path,
        "logit_bytes_per_token_and_vocab_entry": logit_bytes(setup.logits_path, setup.compute_bytes),
        "padding": "none (sequences packed)"
        if setup.logits_path == "flash"
        else "micro-batches of a fixed number of sequences padded to at most the token budget"
        if req.config.trainer == "verl"
        else "agl's trainer pads micro-batches to their longest sequence within the budget",
        "gradient_checkpointing": setup.gradient_checkpointing,
        "sharded_over_ranks": shards,  # the weights, gradients and moments: one copy per shard group
    }


def _flash_attention(req: PlanRequest) -> bool:
    from agl_trainer.verl.settings import flash_attention_available

    return flash_attention_available() if req.flash_attention is None else req.flash_attention


def _update_setup(req: PlanRequest, shape: ModelShape, tokens: int, ranks: int, shards: int) -> UpdateSetup:
    policy = req.config.policy
    verl = req.config.trainer == "verl"
    return UpdateSetup(
        shape,
        tokens,
        ranks=ranks,
        shard_group=shards,
        fsdp=verl,
        lora=policy.lora,
        lora_rank=policy.lora_rank,
        lora_targets=tuple(policy.lora_targets),
        compute_bytes=2,
        # verl's CUDA profile checkpoints; agl's own trainer keeps every layer's activations
        gradient_checkpointing=req.config.trainer == "verl",
        # agl's trainer computes logits at response positions only: a quarter of the budget is a generous bound
        # for agents whose prompts (system prompt, history, tool results) outweigh their answers
        logit_tokens=None if verl else tokens // 4,
        # verl turns logits into log-probs with flash-attn's in-place cross-entropy when it is installed (and then
        # packs sequences without padding), else row by row in PyTorch (agl_trainer.plan.memory.logit_bytes)
        logits_path=("flash" if _flash_attention(req) else "torch") if verl else "agl",
    )


def _phases(req: PlanRequest, shape: ModelShape, layout: Layout, update_total: float) -> dict[str, float]:
    """Each phase's memory on the busiest GPU, in GiB."""
    cfg = req.config
    if layout.vllm is None:  # agl's embedded engine: the model the trainer updates is the one it generates with
        kv_per_token = 2 * shape.layers * shape.kv_dim * 2
        engine = cfg.max_batch * cfg.max_transition_tokens * kv_per_token / 2**30
        weights = shape.params * 2 / 2**30
        logits = cfg.max_batch * cfg.max_transition_tokens * shape.vocab * 6 / 2**30  # prefill logits, bf16 + fp32
        return {"rollouts": CUDA_CONTEXT_GIB + weights + engine + logits, "update": update_total}
    budget = layout.vllm.memory["budget"]
    if layout.mode == "split":
        return {"rollouts (vLLM's GPUs)": budget, "update (the trainer's GPUs)": update_total}
    # colocated: the trainer's state is in host memory during rollouts (agl's own trainer keeps its weights)
    resident = CUDA_CONTEXT_GIB + (0.0 if cfg.trainer == "verl" else shape.params * 2 / 2**30)
    return {"rollouts": budget + resident, "update": update_total + VLLM_ASLEEP_GIB}


def _limits(req: PlanRequest, layout: Layout, phases: dict[str, float]) -> dict[str, float]:
    """What each phase may fill: the usable memory less the headroom, but a phase vLLM fills (its own budget,
    which vLLM enforces, and the trainer's context beside it) the usable memory."""
    fill, usable = fill_limit(req), usable_gib(req.hardware)
    return {k: usable if layout.vllm is not None and k.startswith("rollouts") else fill for k in phases}


def _over(req: PlanRequest, layout: Layout, phases: dict[str, float]) -> bool:
    limits = _limits(req, layout, phases)
    return any(v > limits[k] for k, v in phases.items())


def _update_fits(req: PlanRequest, shape: ModelShape, layout: Layout, setup: UpdateSetup) -> bool:
    return not _over(req, layout, _phases(req, shape, layout, update_memory(setup)["total"]))


def _token_budget(req: PlanRequest, shape: ModelShape, layout: Layout, ranks: int, shards: int, longest: int) -> int:
    """The largest token budget (a multiple of `BUDGET_STEP`, at least the longest transition, at most
    `MAX_TOKEN_BUDGET`) whose update fits; the longest transition if none does (the plan then says it does not
    fit)."""
    cfg = req.config
    if cfg.trainer != "verl":
        return max(int(cfg.policy.micro_batch_tokens), longest)
    best = longest
    for tokens in range(BUDGET_STEP, MAX_TOKEN_BUDGET + 1, BUDGET_STEP):
        if tokens >= longest:
            if not _update_fits(req, shape, layout, _update_setup(req, shape, tokens, ranks, shards)):
                break
            best = tokens
    return best


def vllm_settings(
    req: PlanRequest,
    path: Path,
    shape: ModelShape,
    layout: Layout,
    longest: int,
    python: str,
    chat_template: str | None,
) -> Any:
    """The `VLLMSettings` of each planned server (the same for every node): what the plan prints and the run starts."""
    from agl_trainer.engines.vllm_server import VLLMSettings

    assert layout.vllm is not None
    cfg = req.config
    renders = _template_renders_tools(path) if chat_template is None else False
    adapters = 0
    if cfg.policy.lora:
        adapters = len({a for a in (cfg.train_agents or "").split(",") if a}) if cfg.per_agent_policies else 1
    return VLLMSettings(
        model=path,
        log_path=Path(cfg.run_dir) / "logs" / "vllm.log",
        python=python,
        dtype="bfloat16",
        device="cuda",
        lora_adapters=adapters,
        lora_rank=cfg.policy.lora_rank,
        full_weights_reload=not cfg.policy.lora,
        chat_template=chat_template,
        gpu_memory_utilization=layout.vllm.utilization,
        tool_parser=tool_parser(shape, template_renders_tools=renders).parser,
        max_model_len=longest,
        tensor_parallel=layout.vllm.tensor_parallel,
        data_parallel=layout.vllm.data_parallel,
        sleep_mode=layout.mode == "colocated",
        # split: the node's last K GPUs (the trainer's local Ray counts the first ones as its own)
        gpu_ids=layout.vllm.split_gpu_ids if layout.mode == "split" else None,
    )


def _verl(
    req: PlanRequest, path: Path, tokens: int, warnings: list[dict[str, str]], ranks_per_node: Sequence[int]
) -> dict[str, Any]:
    from agl_trainer.verl import VerlUnavailable, require_verl
    from agl_trainer.verl.settings import actor_settings, cuda_profile, root_config, validate

    cfg = req.config
    profile = cuda_profile(tokens, lora=cfg.policy.lora, flash_attention=req.flash_attention)
    if not profile.remove_padding:
        warnings.append(
            {
                "message": "flash-attn is not installed: verl will attend with sdpa over padded batches",
                "change": FLASH_ATTN_HINT,
            }
        )
    settings = actor_settings(path, cfg.policy, profile, seed=cfg.seed, ranks_per_node=ranks_per_node)
    out: dict[str, Any] = {
        "profile": dataclasses.asdict(profile),
        "settings": settings,
        "overrides": req.verl_overrides,
    }
    try:
        out["version"] = require_verl()
    except VerlUnavailable as exc:
        out["validated"] = False
        warnings.append(
            {"message": f"verl's config was not validated: {exc}", "change": 'pip install "agl-trainer[verl]"'}
        )
        return out
    from omegaconf import OmegaConf

    root = root_config(settings, req.verl_overrides)
    validate(root, load_tokenizer=_has_tokenizer(path))
    out["validated"] = True
    out["config"] = OmegaConf.to_container(root.actor_rollout_ref, resolve=True)
    return out


def verl_actors(cfg: TrainConfig) -> int:
    """verl trains one adapter per actor: with a policy per agent, each agent's actor has ranks of its own."""
    if cfg.trainer != "verl" or not cfg.per_agent_policies:
        return 1
    return len({a for a in (cfg.train_agents or "").split(",") if a}) or 1


def trainer_ranks(req: PlanRequest) -> int:
    """verl's data-parallel ranks per actor: `trainer_workers` when given; unset, every GPU the plan gives the
    trainer (each node's GPUs less vLLM's `rollout_gpus`, over every node), shared by the actors; 1 with agl's."""
    cfg, hw = req.config, req.hardware
    if cfg.trainer != "verl":
        return 1
    if cfg.trainer_workers is not None:
        return int(cfg.trainer_workers)
    free = (hw.gpus_per_node - (req.rollout_gpus or 0)) * hw.nodes
    return max(1, free // verl_actors(cfg))


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """What a run takes from its plan besides the printed object."""

    path: Path
    shape: ModelShape
    layout: Layout
    longest: int
    token_budget: int
    fits: bool
    refusal: str | None
    hardware: Hardware | None = None  # what it was planned for


def make_plan(req: PlanRequest) -> dict[str, Any]:
    """The plan of `req.config` on `req.hardware` (see the module's docstring)."""
    return plan_run(req)[0]


def plan_run(req: PlanRequest) -> tuple[dict[str, Any], RunPlan]:
    """The plan (the printed object) and what the run itself uses of it."""
    from agl_trainer.models import resolve_model

    cfg, hw = req.config, req.hardware
    cfg.validate()  # what a run refuses, the plan refuses too
    hw.validate()
    fill = fill_limit(req)  # a bad --headroom-gib is refused before anything is read
    path = resolve_model(cfg.model)
    shape = read_shape(path)
    warnings: list[dict[str, str]] = []
    longest = cfg.max_transition_tokens
    if longest > shape.max_positions:
        warnings.append(
            {
                "message": f"max_transition_tokens {longest} is past the model's {shape.max_positions} positions",
                "change": f"max_transition_tokens = {shape.max_positions} (in --config)",
            }
        )
        longest = shape.max_positions
    actors = verl_actors(cfg)
    ranks = trainer_ranks(req)
    vllm = cfg.engine == "vllm" and cfg.engine_url is None
    try:
        layout = choose_layout(
            shape, hw, ranks=ranks * actors, rollout_gpus=req.rollout_gpus, max_model_len=longest, vllm=vllm
        )
    except ValueError as exc:
        if not hw.node_names:
            raise
        raise ValueError(f"{exc}; the Ray cluster has {hw.describe_nodes()}") from exc
    trainer_gpus = sum(layout.trainer_gpus_per_node)
    free = hw.gpus - (req.rollout_gpus or 0) * hw.nodes
    if cfg.trainer == "verl" and ranks < free // actors:  # only an explicit --trainer-workers leaves GPUs idle
        warnings.append(
            {
                "message": f"the trainer uses {trainer_gpus} of {free} GPUs it could use; the rest idle during updates "
                "(leave --trainer-workers out: every GPU the plan gives the trainer)",
                "change": f"--trainer-workers {free // actors}",
            }
        )
    if hw.nodes > 1 and not cfg.ray_address:
        warnings.append(
            {
                "message": f"{hw.nodes} nodes need a Ray cluster spanning them: verl's ranks"
                + (" and each node's vLLM server (listed) are" if vllm else " are")
                + " started through it",
                "change": "start Ray on each node (ray start --head / --address) and pass --ray-address",
            }
        )
    if not vllm and shape.params > 3e9:
        warnings.append(
            {
                "message": "agl's embedded engine generates token by token in Python: slow for a model this size",
                "change": "--engine vllm",
            }
        )
    staleness = cfg.max_staleness
    if staleness and vllm and layout.mode == "colocated":
        staleness = 0
        warnings.append(
            {
                "message": f"max_staleness {cfg.max_staleness} runs as 0: vLLM shares the GPUs with the trainer and "
                "sleeps during each update, so no rollout can overlap one",
                "change": "--rollout-gpus N (vLLM on GPUs of its own: rollouts run during updates)",
            }
        )
    elif not staleness and vllm and layout.mode == "split":
        warnings.append(
            {
                "message": "vLLM has GPUs of its own but idles during each update (max_staleness 0); rollouts of the "
                "next step could run meanwhile",
                "change": "--max-staleness 1 --is-cap 2 (README: rollouts overlapping updates)",
            }
        )
    elif staleness and not vllm and cfg.engine_url is None:
        warnings.append(
            {
                "message": "agl's embedded engine generates with the model being updated: rollouts wait during each "
                "update, so max_staleness overlaps only the agents' own work with it",
                "change": "--engine vllm --rollout-gpus N",
            }
        )
    shards = shard_group(req, ranks, layout.trainer_gpus_per_node if actors == 1 else [])
    tokens = _token_budget(req, shape, layout, ranks, shards, longest)
    parts = update_memory(_update_setup(req, shape, tokens, ranks, shards))
    phases = _phases(req, shape, layout, parts["total"])
    peak = max(phases.values())
    reasons = []
    if layout.vllm is not None and layout.vllm.memory["kv_tokens"] < longest:
        reasons.append(_vllm_knob(shape, hw, layout, longest))
    if _over(req, layout, phases):
        limits = _limits(req, layout, phases)
        worst = max(phases, key=lambda k: phases[k] - limits[k])
        reasons.append(_knob(req, shape, layout, longest, phases[worst], limits[worst]))
    fits = not reasons
    refusal = "; ".join(reasons) or None
    servers: list[dict[str, Any]] = []
    servers_per_node: dict[str, Any] = {}
    if vllm and layout.vllm is not None:  # a server per data-parallel rank where LoRA needs it (plan.vllm_plan)
        from agl_trainer.plan.vllm_plan import planned_servers

        planned = planned_servers(
            req,
            shape,
            layout,
            lambda python: vllm_settings(req, path, shape, layout, longest, python, None),
            _template_renders_tools(path),
        )
        servers = planned["servers"]
        servers_per_node = {"servers_per_node": planned["per_node"]} | (
            {"servers_why": planned["why"]} if "why" in planned else {}
        )
    plan: dict[str, Any] = {
        "agl_plan": 1,
        "hardware": dataclasses.asdict(hw),
        "model": {
            "path": str(path),
            "model_type": shape.model_type,
            "params_b": round(shape.params / 1e9, 3),
            "layers": shape.layers,
            "hidden": shape.hidden,
            "vocab": shape.vocab,
            "max_positions": shape.max_positions,
        },
        "run": {
            "trainer": cfg.trainer,
            "engine": cfg.engine,
            "lora": cfg.policy.lora,
            "trainer_workers": ranks,
            "verl_actors": actors if cfg.trainer == "verl" else 0,
            "max_transition_tokens": longest,
            "max_staleness": staleness,
        },
        "placement": {
            "mode": layout.mode,
            "why": layout.why,
            "gpus_per_node": layout.trainer_gpus_per_node,
            "vllm": None if layout.vllm is None else {**dataclasses.asdict(layout.vllm), **servers_per_node},
        },
        "vllm": servers,
        "verl": (
            _verl(req, path, tokens, warnings, layout.trainer_gpus_per_node if actors == 1 else [])
            if cfg.trainer == "verl"
            else None
        ),
        "memory": {
            "gpu_memory_gib": hw.gpu_memory_gib,
            "usable_gib": round(usable_gib(hw), 2),
            "headroom_gib": req.headroom,
            "headroom_why": HEADROOM_WHY,
            # the update's phases fill at most this; vLLM's own share is held to the usable memory alone
            "fill_limit_gib": round(fill, 2),
            "token_budget": tokens,
            "assumes": _assumptions(req, shape, tokens, ranks, shards),
            "update": parts,
            "phases": {k: round(v, 2) for k, v in phases.items()},
            "peak_gib_per_gpu": round(peak, 2),
            "fits": fits,
        },
        "warnings": warnings,
        "fits": fits,
        "refusal": refusal,
    }
    return plan, RunPlan(path, shape, layout, longest, tokens, fits, refusal, hw)


def _vllm_knob(shape: ModelShape, hw: Hardware, layout: Layout, longest: int) -> str:
    """Why vLLM cannot serve on the GPUs it has, and how many it needs."""
    from agl_trainer.plan.memory import vllm_memory

    assert layout.vllm is not None
    have = layout.vllm.gpus_per_server
    memory = layout.vllm.memory
    head = (
        f"vLLM on {have} GPU(s) of {hw.gpu_memory_gib:g} GiB has room for {memory['kv_tokens']} KV-cache tokens "
        f"after {memory['weights']:.1f} GiB of weights per GPU, fewer than one sequence of {longest}"
    )
    tp = 1
    while tp <= 64:
        need = vllm_memory(
            shape, gpu_memory_gib=hw.gpu_memory_gib, utilization=layout.vllm.utilization, tensor_parallel=tp
        )
        if need["kv_tokens"] >= 4 * longest:
            what = "--rollout-gpus" if layout.mode == "split" else "--gpus-per-node"
            return f"{head}: it needs {tp} GPUs per server (tensor parallel {tp}), {what} {tp} or more"
        tp *= 2
    return f"{head}: shorten max_transition_tokens"


def _knob(req: PlanRequest, shape: ModelShape, layout: Layout, longest: int, peak: float, limit: float) -> str:
    """What would make a plan that does not fit fit, tried in the order a user would try them."""
    cfg, hw = req.config, req.hardware
    kept = f" ({usable_gib(hw):.1f} less a {req.headroom:g} GiB headroom)" if limit < usable_gib(hw) else ""
    head = f"needs {peak:.1f} GiB on a GPU, {limit:.1f} GiB usable of {hw.gpu_memory_gib:g}{kept}"
    if cfg.trainer == "verl":
        per_node = hw.gpus_per_node - (req.rollout_gpus or 0)
        ranks_now = trainer_ranks(req)
        for ranks in range(ranks_now + 1, per_node * hw.nodes + 1):
            if _update_fits(req, shape, layout, _update_setup(req, shape, longest, ranks, _shards_at(req, ranks))):
                return f"{head}: shard the update over more GPUs, --trainer-workers {ranks}"
        # HSDP keeps one copy of the state per node: sharding it over every rank may fit where a node's ranks do not
        if _shards_at(req, ranks_now) < ranks_now and _update_fits(
            req, shape, layout, _update_setup(req, shape, longest, ranks_now, ranks_now)
        ):
            return f"{head}: shard the update across nodes, {ACROSS_NODES} (each layer's all-gather then crosses nodes)"
    if not cfg.policy.lora:
        return f"{head}: train a LoRA adapter instead of every weight (drop --full-finetune)"
    if layout.vllm is None and cfg.trainer != "verl":
        return f"{head}: --trainer verl --engine vllm (sharded updates, gradient checkpointing, vLLM in sleep mode)"
    from agl_trainer.verl.settings import hsdp_shard_size

    g = hw.gpus_per_node
    for ranks in range(1, 1025):
        nodes = -(-ranks // g)
        update = update_memory(_update_setup(req, shape, longest, ranks, ranks))["total"]
        fits_at = update + VLLM_ASLEEP_GIB <= fill_limit(req)
        if fits_at:
            # on full nodes of several GPUs the run shards within a node (HSDP) unless told to shard over every rank
            hsdp = hsdp_shard_size([min(g, ranks - i) for i in range(0, ranks, g)]) > 0
            across = f" and {ACROSS_NODES}" if hsdp else ""
            return (
                f"{head}: the update needs {ranks} GPUs of {hw.gpu_memory_gib:g} GiB ({nodes} node(s) of "
                f"{hw.gpus_per_node}): --gpus-per-node / --nodes and --trainer-workers {ranks}{across}"
            )
    return f"{head}: no number of GPUs of {hw.gpu_memory_gib:g} GiB holds this model's update"


def write_plan(plan: dict[str, Any], run_dir: str | os.PathLike[str]) -> Path:
    path = Path(run_dir) / "plan.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plan, indent=2, default=str) + "\n")
    return path
