"""A run's backends, set up before its first step: on CUDA the run's plan (refused here if it would not fit);
vLLM first where it serves on the GPUs; the policy trainer (agl's, or verl's actor workers); the engine that
generates (the embedded one, sharing the trainer's model, or a remote one that gets the trainer's weights); and
whether rollouts may overlap updates (`max_staleness`)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

from rich.console import Console

from agl_trainer.backends import InferenceBackend, PolicyBackend
from agl_trainer.config import TrainConfig
from agl_trainer.engines.colocation import Colocation
from agl_trainer.engines.embedded import BASE_MODEL, Engine
from agl_trainer.engines.fleet import EngineFleet
from agl_trainer.engines.local_servers import vllm_servers_here
from agl_trainer.engines.remote import open_remote_engine
from agl_trainer.engines.serving import EngineServer
from agl_trainer.engines.vllm_server import VLLMServer, find_vllm_python, servers_per_node, split_per_gpu
from agl_trainer.models import load_model, load_tokenizer, pick_device
from agl_trainer.plan.build import PlanRequest, RunPlan
from agl_trainer.plan.hardware import Hardware
from agl_trainer.policy.trainer import PolicyTrainer, wrap_lora


@dataclass
class Backends:
    policy: PolicyBackend
    inference: InferenceBackend
    weights_lock: contextlib.AbstractContextManager[Any]  # held while the weights change: no generation meanwhile
    upstream_model: str | None  # the model name the proxy asks the engine for (None: the engine's default)
    sharing: Colocation | None  # vLLM and the trainer taking turns on the same GPUs
    # weights the update changed that the engine's copy of the model does not share yet (verl trains elsewhere)
    sync_engine: Callable[[], None] | None
    upstream: str  # the URL the proxy forwards to
    where: str  # a description of the engine, for the run's first line
    # the servers agl started on each node, or on each GPU of this one (engines.local_servers): the proxy routes
    # over all; a lost one leaves its rotation
    fleet: EngineFleet | None = None
    # the key the engine's servers ask for (agl_vllm_gate), which the proxy sends them: `AGL_UPSTREAM_API_KEY`
    upstream_key: str | None = None


def gpu_plan(config: TrainConfig, run_dir: Path, console: Console) -> RunPlan | None:
    """The run's plan (agl_trainer.plan), written to `plan.json`, when it trains on GPUs: those of the Ray cluster
    verl trains on (`ray_address`, or a Ray this process joined) when it declares some, else this machine's CUDA
    (`run_hardware`). A plan that does not fit stops the run here, before anything starts, naming what would make it
    fit. Sets `config.trainer_workers` when unset: every GPU the plan gives the trainer (1 without a plan)."""
    from agl_trainer.plan.build import plan_run, write_plan

    cfg = config
    hardware = run_hardware(cfg)
    if hardware is None:
        if cfg.trainer_workers is None:
            cfg.trainer_workers = 1
        return None
    plan, run_plan = plan_run(plan_request(cfg, hardware))
    written = write_plan(plan, run_dir)
    where = f" on {hardware.describe_nodes()}" if hardware.node_names else ""
    console.print(
        f"plan: {run_plan.layout.mode} on {hardware.gpus} × {hardware.gpu_name or 'GPU'} "
        f"({hardware.gpu_memory_gib:g} GiB){where}, peak {plan['memory']['peak_gib_per_gpu']} GiB per GPU, "
        f"token budget {run_plan.token_budget}, {plan['run']['trainer_workers']} trainer rank(s) · {written}"
    )
    if hardware.gpu_memory_from == "assumed":
        from agl_trainer.plan.cluster import MEMORY_RESOURCE

        console.print(
            f"  [yellow]plan:[/] the cluster's GPUs are of no type agl knows: {hardware.gpu_memory_gib:g} GiB each "
            f"assumed → declare it on each node: ray start --resources='{{\"{MEMORY_RESOURCE}\": G}}'"
        )
    for warning in plan["warnings"]:
        console.print(f"  [yellow]plan:[/] {warning['message']} → {warning['change']}")
    if not run_plan.fits:
        raise ValueError(f"this run would not fit on its GPUs ({written}): {run_plan.refusal}")
    if cfg.trainer_workers is None:  # auto: the plan's ranks, for everything the run starts
        cfg.trainer_workers = int(plan["run"]["trainer_workers"])
    return run_plan


def run_hardware(config: TrainConfig) -> Hardware | None:
    """What a run plans for (a `Hardware`), None when it trains on no GPU: with verl, the Ray cluster it joins
    (`ray_address`, or one this process joined) when that declares GPUs, even from a driver without CUDA (a CPU head
    node); else this machine's CUDA. `device = "cpu"` plans nothing."""
    from agl_trainer.plan.cluster import from_ray, joined_ray
    from agl_trainer.plan.hardware import detect

    cfg = config
    if cfg.device.startswith("cpu"):
        return None
    if cfg.trainer == "verl" and (cfg.ray_address or joined_ray()):
        cluster = from_ray(cfg.ray_address)
        if cluster is not None:
            return cluster
    return detect() if pick_device(cfg.device).startswith("cuda") else None


def plan_request(config: TrainConfig, hardware: Hardware) -> PlanRequest:
    """The plan's request for `config` on `hardware`, as `agl train --plan` makes it (agl_trainer.plan.cli)."""
    from agl_trainer.verl.settings import parse_overrides

    return PlanRequest(
        config,
        hardware,
        rollout_gpus=config.rollout_gpus or None,
        verl_overrides=parse_overrides(list(config.verl_set)),
    )


def open_backends(
    config: TrainConfig,
    path: Path,
    stack: ExitStack,
    *,
    plan: RunPlan | None,
    agent_adapters: dict[str, str],
    run_dir: Path,
    console: Console,
) -> Backends:
    """The policy backend and the engine for the model at `path`, closed with `stack`."""
    cfg = config
    remote = bool(cfg.engine_url) or cfg.engine == "vllm"
    sharing: Colocation | None = None
    vllm = None
    if plan is not None and cfg.engine == "vllm":
        vllm, sharing = start_vllm_first(cfg, plan, path, stack, console)
    # with verl the update runs in its workers and another process generates: the driver holds no model (a 7B
    # in fp32 would be 30 GB of host memory for nothing); with agl's engine the model is the one it generates with
    model: Any = None
    if cfg.trainer == "verl" and remote:
        tokenizer = load_tokenizer(path)
    else:
        model, tokenizer = load_model(path, device=cfg.device)
        if cfg.policy.lora:
            model = wrap_lora(model, cfg.policy, adapters=list(agent_adapters.values()) or ["default"])
    policy: PolicyBackend
    if cfg.trainer == "verl":
        policy = verl_policy(cfg, path, tokenizer, stack, plan=plan, agent_adapters=agent_adapters, console=console)
    else:
        policy = PolicyTrainer(model, cfg.policy, pad_id=tokenizer.pad_token_id, agent_adapters=agent_adapters)
    if cfg.engine_url or cfg.engine == "vllm":
        # serving happens elsewhere (a vLLM server agl starts, another `agl engine`, a vLLM server someone runs):
        # it gets our weights now, and its log-probs are checked against ours
        if sharing is not None:
            sharing.policy = cast(Any, policy)
        cpu_threads = split_cores_with_vllm(cfg, policy, console) if cfg.engine == "vllm" and vllm is None else 0
        backend, upstream, where = open_remote_engine(
            url=cfg.engine_url,
            vllm_python=cfg.vllm_python,
            model_path=path,
            model=model,
            tokenizer=tokenizer,
            # VerlPolicy publishes the same way (config, device, agent_adapters, save, adapter_folder, logprobs)
            policy=cast(PolicyTrainer, policy),
            run_dir=run_dir,
            console=console,
            stack=stack,
            server=vllm,
            sharing=sharing,
            cpu_threads=cpu_threads,
            # with a shared checkpoint folder, published versions go there, written once, where every node reads
            # them, and nowhere else (the run's folder is on the driver's disk only)
            published=Path(cfg.checkpoint_dir) / "published" if cfg.checkpoint_dir else None,
        )
        return Backends(
            policy=policy,
            inference=backend,
            weights_lock=contextlib.nullcontext(),
            upstream_model=None if agent_adapters else "default",
            sharing=sharing,
            sync_engine=None,
            upstream=upstream,
            where=where,
            fleet=vllm if isinstance(vllm, EngineFleet) else None,
            upstream_key=backend.headers.get("Authorization", "").removeprefix("Bearer ") or None,
        )
    sync_engine: Callable[[], None] | None = None
    if cfg.trainer == "verl":  # the embedded engine generates with `model`, which verl's update leaves as it was
        sync_engine = partial(cast(Any, policy).load_into, model)
    engine = Engine(model, tokenizer, max_batch=cfg.max_batch).start()
    if agent_adapters:
        engine.default_adapter = BASE_MODEL  # calls routed to no agent's policy: the base model
    stack.callback(engine.close)
    eval_temperature = cfg.temperature if cfg.eval_temperature is None else cfg.eval_temperature
    front = EngineServer(engine, default_temperature=cfg.temperature, eval_temperature=eval_temperature)
    stack.callback(front.start().stop)
    return Backends(
        policy=policy,
        inference=engine,
        weights_lock=engine.lock,  # no generation while the weights change
        upstream_model=None,
        sharing=sharing,
        sync_engine=sync_engine,
        upstream=front.url,
        where=f"embedded engine on {engine.device}",
    )


def choose_overlap(
    config: TrainConfig, sharing: Colocation | None, inference: InferenceBackend, console: Console
) -> tuple[int, bool]:
    """With max_staleness ≥ 1: whether rollouts can run during updates here, and how versions stay exact —
    (the run's max staleness, whether the proxy holds calls around each update)."""
    if not config.max_staleness:
        return config.max_staleness, False
    if sharing is not None:
        # vLLM sleeps while the trainer holds the GPUs: nothing generates during an update (the plan says so)
        console.print(
            "[yellow]max staleness 0: vLLM shares the GPUs with the trainer and sleeps during updates, so no "
            "rollout can overlap one (give vLLM GPUs of its own with --rollout-gpus to overlap)[/]"
        )
        return 0, False
    # a LoRA adapter per version keeps the previous version serving while the next one loads; the embedded
    # engine's model and a full-weights reload change under the calls in flight, so those are held meanwhile
    return config.max_staleness, not getattr(inference, "serves_previous_version_while_loading", False)


def split_cores_with_vllm(config: TrainConfig, policy: PolicyBackend, console: Console) -> int:
    """vLLM's OpenMP threads on a CPU. With overlap, generation and the update run at once on the same cores:
    each gets half (measured on 2 cores: with both on every core, OpenMP's threads contend and generation fell
    from ~50 to 1-3 tokens/s while the update ran). Without overlap they take turns, and each has them all."""
    import torch

    cores = os.cpu_count() or 1
    device = str(getattr(policy, "device", config.device))
    if not config.max_staleness or device.startswith("cuda") or cores < 2:
        return 0
    engine = cores // 2
    torch.set_num_threads(cores - engine)
    console.print(
        f"max staleness {config.max_staleness} on a CPU: vLLM generates on {engine} of {cores} cores while the "
        f"trainer updates on {cores - engine}"
    )
    return engine


def start_vllm_first(
    config: TrainConfig, plan: RunPlan, path: Path, stack: ExitStack, console: Console
) -> tuple[VLLMServer | EngineFleet, Colocation | None]:
    """vLLM before the trainer's model: it refuses to start unless its share of the GPU is free. Planned on a Ray
    cluster, one server on each of its GPU nodes (agl_trainer.engines.fleet); else one on this machine, or one per
    data-parallel rank where LoRA needs it (agl_trainer.engines.local_servers, a fleet to the rest of the run). On
    colocated GPUs they then sleep until the trainer's first weights are written (agl_trainer.engines.colocation):
    the server(s), and their turns with the trainer there."""
    from transformers import AutoTokenizer

    from agl_trainer.chat_format import engine_chat_template
    from agl_trainer.plan.build import PlanRequest, vllm_settings

    cfg = config
    template = engine_chat_template(AutoTokenizer.from_pretrained(path))
    python = str(find_vllm_python(cfg.vllm_python))
    hardware = plan.hardware if plan.hardware is not None else detect_hardware_or_fail()
    request = PlanRequest(cfg, hardware)
    settings = vllm_settings(request, path, plan.shape, plan.layout, plan.longest, python, template)
    # every route of every server asks for the run's key (agl_vllm_gate): on a cluster each listens on its node's
    # address, where sleep, wake and weight reloads were open to anyone who reached it
    settings = dataclasses.replace(settings, api_key=secrets.token_urlsafe(32))
    server: VLLMServer | EngineFleet
    if hardware.node_ids:
        server = start_fleet(settings, plan, hardware, console)
    elif servers_per_node(settings) > 1:  # LoRA over data-parallel ranks: a server per rank (plan.vllm_plan)
        server = vllm_servers_here(split_per_gpu(settings), console)
    else:
        server = VLLMServer(settings, console).start()
    stack.callback(server.stop)
    sharing = None
    if plan.layout.mode == "colocated":
        servers = server if isinstance(server, EngineFleet) else None
        sharing = Colocation(
            server.url, _NoPolicyYet(), level=1 if cfg.policy.lora else 2, servers=servers, headers=server.headers
        )
        stack.callback(sharing.close)
        sharing.sleep_engine()
    return server, sharing


def start_fleet(settings: Any, plan: RunPlan, hardware: Any, console: Console) -> EngineFleet:
    """The plan's vLLM server on each GPU node of the Ray cluster, through Ray (agl_trainer.engines.fleet). Split,
    each asks Ray for its GPUs, which then never go to a trainer rank; vLLM runs on whichever ones Ray gives it."""

    from agl_trainer.engines.fleet import vllm_on_node

    slots, gpus = fleet_slots(settings, plan, hardware)
    nodes = [(node_id, name) for node_id, name, _ in slots]
    launches = [partial(vllm_on_node, each) for _, _, each in slots]
    return EngineFleet.start(launches, nodes, gpus_per_server=gpus, console=console, settings=slots[0][2])


def fleet_slots(settings: Any, plan: RunPlan, hardware: Any) -> tuple[list[tuple[str, str, Any]], int]:
    """The servers of each node ((Ray node id, name, settings)) and the GPUs each asks Ray for: one per node, or
    one per data-parallel rank where LoRA needs it (`split_per_gpu`). Colocated, a server per rank keeps its GPU
    slice of the node (CUDA_VISIBLE_DEVICES, its actor asking Ray for none); split, each asks Ray for its
    tensor-parallel GPUs and runs on those Ray gives it, never a trainer rank's."""
    split = plan.layout.mode == "split" and plan.layout.vllm is not None
    each = split_per_gpu(settings)
    gpus = 0
    if split and plan.layout.vllm is not None:
        gpus = plan.layout.vllm.gpus_per_server if len(each) == 1 else settings.tensor_parallel
    if split or len(each) == 1:  # Ray's CUDA_VISIBLE_DEVICES, not the node's last K
        each = [dataclasses.replace(s, gpu_ids=None) for s in each]
    slots = []
    for node_id, name in zip(hardware.node_ids, hardware.node_names, strict=True):
        for i, s in enumerate(each):
            slots.append((node_id, name if len(each) == 1 else f"{name} server {i}", s))
    return slots, gpus


def verl_policy(
    config: TrainConfig,
    path: Path,
    tokenizer: Any,
    stack: ExitStack,
    *,
    plan: RunPlan | None,
    agent_adapters: dict[str, str],
    console: Console,
) -> PolicyBackend:
    """verl's actor worker as the policy backend (agl_trainer.verl): started on Ray now, stopped with the run."""
    from agl_trainer.verl.backend import VerlPolicy

    cfg = config
    workers = cfg.trainer_workers or 1  # set by gpu_plan (None only where it did not run)
    console.print(
        f"verl trainer: {workers} rank(s)"
        + (f" for each of {len(agent_adapters)} agents' policies" if agent_adapters else "")
        + " on "
        + (f"Ray at {cfg.ray_address}" if cfg.ray_address else "a local Ray")
    )
    profile = None
    if plan is not None:  # the plan's CUDA profile: its token budget, flash-attn when installed
        from agl_trainer.verl.settings import cuda_profile

        profile = cuda_profile(plan.token_budget, lora=cfg.policy.lora)
    from agl_trainer.verl.settings import parse_overrides

    actors = len(set(agent_adapters.values())) or 1  # one verl actor per agent's policy

    def make(adapter: str | None = None) -> VerlPolicy:
        return VerlPolicy(
            path,
            cfg.policy,
            pad_id=tokenizer.pad_token_id,
            workers=workers,
            ray_address=cfg.ray_address,
            num_cpus=workers * actors,  # a local Ray holds every actor's ranks
            # split layout: the GPUs vLLM does not hold (the node's first ones)
            num_gpus=(
                plan.layout.trainer_gpus_per_node[0] if plan is not None and plan.layout.mode == "split" else None
            ),
            device="cuda" if profile is not None else cfg.device,
            seed=cfg.seed,
            overrides=parse_overrides(list(cfg.verl_set)),
            profile=profile,
            # the plan's ranks per node for one actor; each agent's actor asks for its own ranks
            placement=plan.layout.trainer_gpus_per_node if plan and actors == 1 else None,
            vllm_gpus=split_vllm_gpus(plan),
        )

    policy: Any
    if agent_adapters:
        from agl_trainer.verl.per_agent import PerAgentVerlPolicy

        policy = PerAgentVerlPolicy(agent_adapters, make)
    else:
        policy = make()
    stack.callback(policy.close)
    return cast(PolicyBackend, policy)


def split_vllm_gpus(plan: RunPlan | None) -> tuple[int, ...]:
    """In the split layout, the GPUs of each node vLLM holds: the last ones (agl_trainer.engines.vllm_server)."""
    if plan is None or plan.layout.mode != "split" or plan.layout.vllm is None:
        return ()
    if plan.hardware is not None and plan.hardware.node_ids:
        return ()  # agl's servers asked Ray for their GPUs (start_fleet): Ray gives no rank one of them
    return plan.layout.vllm.split_gpu_ids


def detect_hardware_or_fail() -> Any:
    from agl_trainer.plan.hardware import detect

    hardware = detect()
    if hardware is None:
        raise RuntimeError("CUDA disappeared between planning and starting vLLM")
    return hardware


class _NoPolicyYet:
    """Colocation's policy before the trainer exists: vLLM sleeps, nothing of the trainer's moves yet."""

    def to_device(self) -> None:
        pass

    def to_host(self) -> None:
        pass

    def update(self, transitions: Any) -> Any:
        raise RuntimeError("no policy yet")
