"""The plan's command-line options, shared by `agl train` and `agl bench train`, and what `--plan` does."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import click

from agl_trainer.plan.cluster import from_ray
from agl_trainer.plan.hardware import Hardware, detect

F = TypeVar("F", bound=Callable[..., Any])

PLAN_FLAGS = ("plan", "gpus_per_node", "nodes", "gpu_memory_gib", "verl_set")


def plan_options(fn: F) -> F:
    """--plan and the flags that describe a machine that is not this one, and --verl-set."""
    options = [
        click.option(
            "--plan",
            is_flag=True,
            help="Print everything the run would start (vLLM command lines, verl's config, GPU placement, memory per"
            " GPU, warnings) as JSON, without loading weights or starting anything; exit 2 if it would not fit.",
        ),
        click.option(
            "--gpus-per-node", type=click.IntRange(min=1), help="--plan: GPUs per node (default: this one's)."
        ),
        click.option("--nodes", type=click.IntRange(min=1), help="--plan: nodes (default 1)."),
        click.option(
            "--gpu-memory-gib",
            type=click.FloatRange(min=1),
            help="--plan: memory per GPU in GiB (default: this one's, else 80).",
        ),
        click.option(
            "--verl-set",
            "verl_set",
            multiple=True,
            metavar="KEY=VALUE",
            help="A verl setting under actor_rollout_ref, e.g. actor.optim.betas=[0.9,0.95] (repeatable; checked by"
            " verl's own config classes).",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def pop_plan_flags(flags: dict[str, Any]) -> dict[str, Any]:
    """The plan's flags out of a command's keyword arguments; --verl-set goes back as the config's `verl_set`."""
    out = {key: flags.pop(key, None) for key in PLAN_FLAGS}
    if out["verl_set"]:
        flags["verl_set"] = tuple(out["verl_set"])
    return out


def print_plan(config: Any, plan_flags: dict[str, Any]) -> None:
    """`--plan`: the plan as JSON on stdout; a plan that does not fit exits 2 with the knob that would help."""
    from agl_trainer.plan.build import PlanRequest, make_plan
    from agl_trainer.verl.settings import parse_overrides

    try:
        # a recipe names only the keys it sizes for; the rest is detected (resolve takes None)
        hardware = resolve(plan_flags.get("gpus_per_node"), plan_flags.get("nodes"), plan_flags.get("gpu_memory_gib"))
        overrides = parse_overrides(list(config.verl_set))
        req = PlanRequest(config, hardware, rollout_gpus=config.rollout_gpus or None, verl_overrides=overrides)
        plan = make_plan(req)
    except (ValueError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(json.dumps(plan, indent=2, default=str))
    if not plan["fits"]:
        click.echo(f"agl train --plan: this run would not fit: {plan['refusal']}", err=True)
        raise SystemExit(2)


def resolve(gpus_per_node: int | None, nodes: int | None, gpu_memory_gib: float | None) -> Hardware:
    """The hardware a plan is for. `--gpus-per-node` / `--nodes` describe a machine that is not this one: each
    given wins, the rest is read off this machine's CUDA. Without them, the Ray cluster this process joined
    (`agl train --plan --ray-address ADDR` joins it first) when it declares GPUs, read as a run reads it
    (agl_trainer.plan.cluster.from_ray), else this machine's CUDA. `--gpu-memory-gib` wins over what either says.
    Without CUDA, a cluster or `--gpus-per-node` there is nothing to plan for."""
    if gpus_per_node is None and nodes is None:
        cluster = from_ray(None, gpu_memory_gib=gpu_memory_gib)
        if cluster is not None:
            return cluster
    here = detect()
    if gpus_per_node is None and here is None:
        raise ValueError(
            "this machine has no CUDA GPU: describe the one to plan for with --gpus-per-node N (and --nodes M, "
            "--gpu-memory-gib G; 80 by default), or plan for a Ray cluster with --ray-address ADDR"
        )
    hardware = Hardware(
        gpus_per_node=gpus_per_node if gpus_per_node is not None else here.gpus_per_node,  # type: ignore[union-attr]
        nodes=nodes or 1,
        gpu_memory_gib=gpu_memory_gib or (here.gpu_memory_gib if here is not None else 80.0),
        gpu_name=here.gpu_name if here is not None and gpus_per_node is None else None,
    )
    hardware.validate()
    return hardware
