"""`agl engine` and `agl train`: the commands agl-trainer adds to the `agl` command line."""

from __future__ import annotations

import logging
from typing import Any

import click

from agl_trainer.options import build_config, click_options, merge, read_option_file
from agl_trainer.plan.cli import plan_options, pop_plan_flags, print_plan


@click.command()
@click.option(
    "--model",
    default="bundled",
    show_default=True,
    help="A local Hugging Face model folder, or 'bundled' for SmolLM2-135M-Instruct.",
)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int, help="0 picks a free port.")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:1, ... or auto.")
@click.option("--max-batch", default=8, show_default=True, type=int, help="Requests decoded together.")
@click.option("--served-model", default="agl-policy", show_default=True, help="The model name it answers to.")
@click.option(
    "--log-level", default="warning", show_default=True, type=click.Choice(["debug", "info", "warning", "error"])
)
def engine(model: str, host: str, port: int, device: str, max_batch: int, served_model: str, log_level: str) -> None:
    """Serve a model with the embedded engine behind an OpenAI-compatible API that returns exact token ids
    (point `agl serve --upstream` at it). Prints `AGL_ENGINE_READY <base url>` once it accepts requests."""
    from agl.common import asgi
    from agl_trainer.engines.embedded import Engine
    from agl_trainer.engines.serving import create_app
    from agl_trainer.models import load_model, resolve_model

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise click.ClickException("the engine has no authentication: bind it to loopback and reach it via agl serve")
    try:
        path = resolve_model(model)
    except FileNotFoundError as exc:
        raise click.ClickException(str(exc)) from exc
    llm, tokenizer = load_model(path, device=device)
    eng = Engine(llm, tokenizer, max_batch=max_batch).start()
    try:
        sock = asgi.bind(host, port)  # requests made right after the announcement wait in the backlog
    except OSError as exc:
        eng.close()
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc}") from exc
    click.echo(f"AGL_ENGINE_READY {asgi.url_of(sock)}/v1", err=False)
    click.echo(f"model {path} on {eng.device}, batches of up to {max_batch}", err=True)
    try:
        asgi.serve(create_app(eng, served_model), sock, log_level=log_level)
    finally:
        eng.close()


EXAMPLES = {"calculator": "agl_trainer.examples.calculator"}


def _read_tasks(path: str, what: str) -> list[object]:
    import json
    from pathlib import Path

    file = Path(path)
    if not file.exists():
        raise click.ClickException(f"{what} file {file} does not exist")
    tasks: list[object] = []
    for lineno, line in enumerate(file.read_text().splitlines(), 1):
        if line.strip():
            try:
                tasks.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise click.ClickException(f"{file}:{lineno}: not valid JSON ({exc})") from exc
    if not tasks:
        raise click.ClickException(f"{what} file {file} holds no tasks")
    return tasks


@click.command()
@click.argument("agent", required=False)
@click.option("--example", type=click.Choice(sorted(EXAMPLES)), help="Train a built-in example (agent and tasks).")
@click.option("--tasks", "tasks_file", help="Training tasks: JSONL, one task input per line.")
@click.option("--eval-tasks", "eval_file", help="Held-out tasks: JSONL, one task input per line.")
@click.option("--config", "config_file", help="TOML or JSON file with any of these options (the flags win).")
@click_options(
    "model",
    "run_dir",
    "steps",
    "tasks_per_step",
    "group_size",
    "eval_every",
    "strategy",
    "train_agents",
    "per_agent_policies",
    "engine",
    "engine_url",
    "vllm_python",
    "trainer",
    "trainer_workers",
    "ray_address",
    "rollout_gpus",
    "headroom_gib",
    "checkpoint_dir",
    "lr",
    "full_finetune",
    "kl_coef",
    "is_cap",
    "is_mode",
    "max_staleness",
    "workers",
    "rollout_workers",
    "concurrency",
    "device",
    "temperature",
    "keep_agent_sampling",
    "eval_temperature",
    "seed",
    "log_to",
    "resume",
)
@plan_options
def train(
    agent: str | None,
    example: str | None,
    tasks_file: str | None,
    eval_file: str | None,
    config_file: str | None,
    **flags: Any,
) -> None:
    """Train the LLM inside AGENT (`module:function` or `path/file.py:function`, decorated with @agl.rollout)
    with LightningRL: rollouts through the proxy, credit assignment, policy updates, held-out evaluation.
    Writes metrics.jsonl, learning_curve.png and checkpoints to the run directory."""
    import importlib
    import time
    from pathlib import Path

    from agl_trainer.backends import EngineError
    from agl_trainer.run.loop import TrainingRun

    plan_flags = pop_plan_flags(flags)
    try:
        options = merge(read_option_file(config_file) if config_file else None, flags)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    if example:
        module = importlib.import_module(EXAMPLES[example])
        agent = agent or f"{module.__name__}:solve"
        options.setdefault("train_tasks", module.train_tasks())
        options.setdefault("eval_tasks", module.eval_tasks())
        for key, value in getattr(module, "RECOMMENDED", {}).items():
            options.setdefault(key, value)
    agent = agent or options.pop("agent", None)
    if not agent:
        raise click.ClickException("name the AGENT to train (module:function), or use --example calculator")
    if tasks_file:
        options["train_tasks"] = _read_tasks(tasks_file, "training tasks")
    if eval_file:
        options["eval_tasks"] = _read_tasks(eval_file, "evaluation tasks")
    for key, what in (("train_tasks", "--tasks"), ("eval_tasks", "--eval-tasks")):
        if key not in options:
            raise click.ClickException(f"no {key.replace('_', ' ')}: give {what} FILE (or --example)")
        if isinstance(options[key], str):
            options[key] = _read_tasks(str(options[key]), key.replace("_", " "))
    name = example or Path(agent.split(":")[0]).stem
    options.setdefault("run_dir", Path("runs") / f"train-{name}-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        config = build_config(agent, options, where=config_file or "the options")
        if plan_flags["plan"]:
            from agl_trainer.plan.cluster import joined

            # --plan --ray-address: the plan of that cluster's nodes and GPUs, read as the run reads them
            # (--gpus-per-node / --nodes describe another machine instead)
            machine_flags = plan_flags["gpus_per_node"] is not None or plan_flags["nodes"] is not None
            with joined(None if machine_flags or config.trainer != "verl" else config.ray_address):
                print_plan(config, plan_flags)
            return
        TrainingRun(config).run()
    except (ValueError, FileNotFoundError, EngineError) as exc:
        raise click.ClickException(str(exc)) from exc
