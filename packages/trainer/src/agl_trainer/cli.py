"""`agl engine` (and, later, `agl train`): commands agl-trainer adds to the `agl` command line."""

from __future__ import annotations

import logging
import socket

import click


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
    import uvicorn

    from agl_trainer.engine import Engine
    from agl_trainer.models import load_model, resolve_model
    from agl_trainer.serving import create_app

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise click.ClickException("the engine has no authentication: bind it to loopback and reach it via agl serve")
    try:
        path = resolve_model(model)
    except FileNotFoundError as exc:
        raise click.ClickException(str(exc)) from exc
    llm, tokenizer = load_model(path, device=device)
    eng = Engine(llm, tokenizer, max_batch=max_batch).start()
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    bound_host, bound_port = sock.getsockname()[:2]
    click.echo(f"AGL_ENGINE_READY http://{bound_host}:{bound_port}/v1", err=False)
    click.echo(f"model {path} on {eng.device}, batches of up to {max_batch}", err=True)
    config = uvicorn.Config(create_app(eng, served_model), log_level=log_level, access_log=False)
    try:
        uvicorn.Server(config).run(sockets=[sock])
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


def _read_config(path: str | None) -> dict[str, object]:
    if path is None:
        return {}
    import json
    from pathlib import Path

    import tomllib

    file = Path(path)
    if not file.exists():
        raise click.ClickException(f"config file {file} does not exist")
    try:
        data = tomllib.loads(file.read_text()) if file.suffix == ".toml" else json.loads(file.read_text())
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise click.ClickException(f"config file {file} is not valid: {exc}") from exc
    if not isinstance(data, dict):
        raise click.ClickException(f"config file {file} must hold a table/object of options")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


@click.command()
@click.argument("agent", required=False)
@click.option("--example", type=click.Choice(sorted(EXAMPLES)), help="Train a built-in example (agent and tasks).")
@click.option("--tasks", "tasks_file", help="Training tasks: JSONL, one task input per line.")
@click.option("--eval-tasks", "eval_file", help="Held-out tasks: JSONL, one task input per line.")
@click.option("--config", "config_file", help="TOML or JSON file with any of these options (the flags win).")
@click.option("--model", default=None, help="Local Hugging Face model folder, or 'bundled' (default).")
@click.option("--run-dir", default=None, help="Where the store, checkpoints, metrics and plot go.")
@click.option("--steps", type=int, default=None, help="Policy updates.  [default: 20]")
@click.option("--tasks-per-step", type=int, default=None, help="Tasks per step.  [default: 8]")
@click.option("--group-size", type=int, default=None, help="Rollouts per task (the GRPO group).  [default: 4]")
@click.option("--eval-every", type=int, default=None, help="Evaluate every k steps.  [default: 5]")
@click.option(
    "--strategy",
    type=click.Choice(["broadcast", "discounted", "grpo", "step"]),
    default=None,
    help="Credit assignment.  [default: grpo]",
)
@click.option(
    "--agents",
    "train_agents",
    default=None,
    help="Agents whose calls are trained, e.g. writer,rewriter (else AGL_TRAIN_AGENTS, else all).",
)
@click.option(
    "--per-agent-policies",
    is_flag=True,
    default=None,
    help="One LoRA policy per selected agent on the shared base model (the others run on the base model).",
)
@click.option(
    "--engine-url",
    default=None,
    help="Generate with an engine in another process (agl engine, vLLM with runtime LoRA) serving the same model.",
)
@click.option(
    "--engine",
    type=click.Choice(["embedded", "vllm"]),
    default=None,
    help="Generate with agl's embedded engine, or a vLLM server agl starts from its own environment (make vllm)."
    "  [default: embedded]",
)
@click.option(
    "--vllm-python",
    default=None,
    help="Python of the environment vLLM runs from (else AGL_VLLM_PYTHON, else .venv-vllm here or in a parent).",
)
@click.option("--lr", type=float, default=None, help="Learning rate.  [default: 2e-4]")
@click.option("--full-finetune", is_flag=True, default=None, help="Train all weights instead of a LoRA adapter.")
@click.option("--kl", "kl_coef", type=float, default=None, help="KL penalty to the base model (LoRA only).")
@click.option("--workers", type=int, default=None, help="Worker processes.  [default: 2]")
@click.option("--concurrency", type=int, default=None, help="Rollouts at once per worker.  [default: 8]")
@click.option("--device", default=None, help="cpu, cuda, ... or auto.")
@click.option(
    "--temperature",
    type=float,
    default=None,
    help="Sampling temperature of training rollouts (when the agent sets none).  [default: 1.0]",
)
@click.option(
    "--eval-temperature",
    type=float,
    default=None,
    help="Decoding of evaluation rollouts (0: greedy).  [default: the --temperature]",
)
@click.option("--seed", type=int, default=None)
@click.option("--resume", is_flag=True, default=None, help="Continue from the run directory's latest checkpoint.")
def train(
    agent: str | None,
    example: str | None,
    tasks_file: str | None,
    eval_file: str | None,
    config_file: str | None,
    **flags: object,
) -> None:
    """Train the LLM inside AGENT (`module:function` or `path/file.py:function`, decorated with @agl.rollout)
    with LightningRL: rollouts through the proxy, credit assignment, policy updates, held-out evaluation.
    Writes metrics.jsonl, learning_curve.png and checkpoints to the run directory."""
    import importlib
    import time
    from dataclasses import fields
    from pathlib import Path

    from agl_trainer.loop import TrainConfig, TrainingRun
    from agl_trainer.policy import PolicyConfig

    options = _read_config(config_file)
    options.update({k: v for k, v in flags.items() if v is not None})
    if example:
        module = importlib.import_module(EXAMPLES[example])
        agent = agent or f"{module.__name__}:solve"
        options.setdefault("train_tasks", module.train_tasks())
        options.setdefault("eval_tasks", module.eval_tasks())
        for key, value in getattr(module, "RECOMMENDED", {}).items():
            options.setdefault(key, value)
    agent = agent or options.pop("agent", None)  # type: ignore[assignment]
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
    policy_keys = {f.name for f in fields(PolicyConfig)}
    policy = {k: options.pop(k) for k in list(options) if k in policy_keys}
    if options.pop("full_finetune", False):
        policy["lora"] = False
    name = example or Path(agent.split(":")[0]).stem
    options.setdefault("run_dir", Path("runs") / f"train-{name}-{time.strftime('%Y%m%d-%H%M%S')}")
    options["run_dir"] = Path(str(options["run_dir"]))
    known = {f.name for f in fields(TrainConfig)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise click.ClickException(f"unknown option(s) in the config: {', '.join(unknown)}")
    from agl_trainer.backends import EngineError

    try:
        config = TrainConfig(agent=agent, policy=PolicyConfig(**policy), **options)  # type: ignore[arg-type]
        TrainingRun(config).run()
    except (ValueError, FileNotFoundError, EngineError) as exc:
        raise click.ClickException(str(exc)) from exc
