"""`agl bench`: list the tasks, evaluate any model on one, train on one (a command group agl-bench adds)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

from agl_bench.recipes import CPU_DEFAULTS
from agl_bench.sources import SOURCES
from agl_bench.task import TASKS
from agl_trainer.options import build_config, click_options, merge
from agl_trainer.plan.cli import plan_options, pop_plan_flags, print_plan


def _load(task_name: str, split: str | None, data: str | None, limit: int | None, default: str) -> tuple[Any, str, Any]:
    from agl_bench.datasets import DataError, datasets_root, limit_rows
    from agl_bench.task import get_task

    try:
        task = get_task(task_name)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    split = split or default.format(train=task.train_split, eval=task.eval_split)
    if split not in task.splits:
        raise click.ClickException(f"{task.name} has no split {split!r}; choose one of {', '.join(task.splits)}")
    try:
        rows = limit_rows(task.load(datasets_root(data, task.name), split), limit)
    except DataError as exc:
        raise click.ClickException(str(exc)) from exc
    return task, split, rows


def _task_options(pairs: tuple[str, ...]) -> dict[str, Any]:
    """`--set top_k=5 --set retriever=dense` → {"top_k": 5, "retriever": "dense"} (values read as JSON if they
    parse, else kept as text): per-run options every task input carries to the agent."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise click.ClickException(f"--set {pair!r}: expected KEY=VALUE")
        try:
            options[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            options[key.strip()] = value
    return options


DATA_OPTION = click.option(
    "--data",
    default=None,
    help="Folder holding spider/, musique/, calc_x/ (default: $AGL_BENCH_DATA, the fetched data in "
    "~/.cache/agl/bench, else ../shared/datasets).",
)
SET_OPTION = click.option("--set", "settings", multiple=True, metavar="KEY=VALUE", help="A task option (repeatable).")


@click.group()
def bench() -> None:
    """Benchmarks of the Agent Lightning paper: Spider (LangGraph), MuSiQue (OpenAI Agents SDK), Calc-X (AutoGen)."""


@bench.command(name="list")
def list_tasks() -> None:
    """The tasks, their splits, metrics and agents."""
    from agl_bench.task import get_task

    for name in TASKS:
        task = get_task(name)
        click.echo(
            f"{task.name:<8} {task.description}\n         splits {', '.join(task.splits)} · metrics "
            f"{', '.join(task.metrics)} · agents {', '.join(task.agents)} (trained by default: "
            f"{', '.join(task.trainable_agents)})"
        )


@bench.command(name="eval")
@click.argument("task_name", metavar="TASK", type=click.Choice(sorted(TASKS)))
@click.option(
    "--model",
    default="embedded",
    show_default=True,
    help="'embedded' (the bundled SmolLM2-135M on the embedded engine), a local model folder, or the base URL of "
    "an OpenAI-compatible endpoint (http://host:8000/v1).",
)
@click.option("--endpoint-model", default=None, help="With a URL: the model name to ask the endpoint for.")
@click.option("--api-key-env", default="OPENAI_API_KEY", show_default=True, help="With a URL: env var holding its key.")
@click.option("--split", default=None, help="Which split (default: the task's evaluation split).")
@click.option("--limit", type=int, default=None, help="Only N rows, drawn with a fixed seed (the same every run).")
@DATA_OPTION
@SET_OPTION
@click.option("--out", default=None, help="Output folder (default runs/bench-<task>-<time>).")
@click.option("--workers", default=1, show_default=True, type=int, help="Worker processes.")
@click.option("--concurrency", default=8, show_default=True, type=int, help="Rollouts at once per worker.")
@click.option("--device", default="auto", show_default=True, help="Device of the embedded engine.")
@click.option(
    "--engine",
    type=click.Choice(["embedded", "vllm"]),
    default="embedded",
    show_default=True,
    help="Serve the bundled model or a model folder with agl's engine, or with vLLM started from .venv-vllm.",
)
@click.option("--vllm-python", default=None, help="Python of vLLM's environment (else AGL_VLLM_PYTHON / .venv-vllm).")
def eval_command(
    task_name: str,
    model: str,
    endpoint_model: str | None,
    api_key_env: str,
    split: str | None,
    limit: int | None,
    data: str | None,
    settings: tuple[str, ...],
    out: str | None,
    workers: int,
    concurrency: int,
    device: str,
    engine: str,
    vllm_python: str | None,
) -> None:
    """Evaluate MODEL on TASK: prints a results table, writes OUT/results.json (every row: metrics, prediction,
    gold, agents called) and keeps the store (OUT/agl.sqlite) for `agl show`."""
    from rich.console import Console

    from agl_bench.evaluation import EvalConfig, ModelSpec, results_table, run_eval

    if workers < 1 or concurrency < 1:
        raise click.ClickException("--workers and --concurrency must be ≥ 1")
    if engine == "vllm" and model.startswith(("http://", "https://")):
        raise click.ClickException("--engine vllm starts a server for a model folder; --model is already a URL")
    task, split, rows = _load(task_name, split, data, limit, "{eval}")
    options = _task_options(settings)
    rows = [{**row, **options} for row in rows]
    out_dir = Path(out or f"runs/bench-{task.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    console = Console()
    console.print(f"[bold]agl bench eval[/] {task.name} · split {split} · {len(rows)} rows · model {model} → {out_dir}")
    config = EvalConfig(
        task=task,
        split=split,
        rows=rows,
        model=ModelSpec(
            model,
            endpoint_model=endpoint_model,
            api_key_env=api_key_env,
            device=device,
            engine=engine,
            vllm_python=vllm_python,
        ),
        out_dir=out_dir,
        workers=workers,
        concurrency=concurrency,
    )
    try:
        report = run_eval(config, console)
    except (ValueError, RuntimeError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from exc
    console.print(results_table(report))
    console.print(
        f"per-row results: {out_dir / 'results.json'} · to inspect rollouts: agl serve --run-dir {out_dir}, "
        "then agl rollouts / agl show ID"
    )


@bench.command(name="train")
@click.argument("task_name", metavar="TASK", type=click.Choice(sorted(TASKS)))
@click.option("--agents", default=None, help="Agents to train, e.g. writer,rewriter (default: the task's).")
@click.option(
    "--recipe",
    default="cpu",
    show_default=True,
    help="'cpu' (the task's small embedded recipe) or a TOML/JSON file of training options (see benchmarks/recipes/).",
)
@click.option("--train-split", default=None, help="Default: the task's training split.")
@click.option("--eval-split", default=None, help="Default: the task's evaluation split.")
@click.option("--train-limit", type=int, default=None, help="Only N training rows (drawn with a fixed seed).")
@click.option("--eval-limit", type=int, default=None, help="Only N held-out rows (drawn with a fixed seed).")
@click.option("--no-air", is_flag=True, help="Leave out the task's automatic intermediate rewards.")
@click_options(
    "model",
    "run_dir",
    "steps",
    "tasks_per_step",
    "group_size",
    "eval_every",
    "strategy",
    "lr",
    "full_finetune",
    "device",
    "engine",
    "engine_url",
    "vllm_python",
    "trainer",
    "trainer_workers",
    "ray_address",
    "rollout_gpus",
    "checkpoint_dir",
    "per_agent_policies",
    "is_cap",
    "is_mode",
    "max_staleness",
    "log_to",
    "resume",
    defaults=CPU_DEFAULTS,
)
@DATA_OPTION
@SET_OPTION
@plan_options
def train_command(
    task_name: str,
    agents: str | None,
    recipe: str,
    train_split: str | None,
    eval_split: str | None,
    train_limit: int | None,
    eval_limit: int | None,
    no_air: bool,
    data: str | None,
    settings: tuple[str, ...],
    **flags: Any,
) -> None:
    """Train the LLM of TASK's agent with LightningRL on the embedded trainer: held-out evaluation (greedy) before,
    during and after, learning curve and checkpoints in the run directory."""
    from agl_bench.recipes import read_recipe, recipe_hardware, recipe_task_options
    from agl_trainer.backends import EngineError
    from agl_trainer.run.loop import TrainingRun

    plan_flags = pop_plan_flags(flags)
    task, train_split, train_rows = _load(task_name, train_split, data, train_limit, "{train}")
    _, eval_split, eval_rows = _load(task_name, eval_split, data, eval_limit, "{eval}")
    try:
        options = merge(read_recipe(recipe, task), flags)
        extra = {**recipe_task_options(recipe), **_task_options(settings)}
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    options["train_tasks"] = [{**row, **extra} for row in train_rows]
    options["eval_tasks"] = [{**row, **extra} for row in eval_rows]
    options["train_agents"] = agents or options.get("train_agents") or ",".join(task.trainable_agents)
    options.setdefault("run_dir", f"runs/bench-train-{task.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    options["air"] = not no_air
    click.echo(
        f"agl bench train {task.name}: {len(train_rows)} {train_split} rows, held-out {len(eval_rows)} "
        f"{eval_split} rows, agents {options['train_agents']}"
        + (f", task options {', '.join(f'{k}={v}' for k, v in sorted(extra.items()))}" if extra else "")
    )
    try:
        config = build_config(task.agent, options, where=f"recipe {recipe}")
        if plan_flags["plan"]:
            print_plan(config, {**recipe_hardware(recipe), **{k: v for k, v in plan_flags.items() if v is not None}})
            return
        TrainingRun(config, air_rules=task.air_rules()).run()
    except (ValueError, FileNotFoundError, EngineError) as exc:
        raise click.ClickException(str(exc)) from exc


@bench.group()
def data() -> None:
    """The tasks' data: fetch it from its official sources, see where each task reads it from."""


@data.command(name="fetch")
# the sources, not only the tasks: a task may read several (swebench_verified beside swebench)
@click.argument("task_names", metavar="TASK...", nargs=-1, required=True, type=click.Choice(sorted(SOURCES)))
@click.option(
    "--to", "into", default=None, help="Folder to fetch into (default: $AGL_BENCH_DATA or ~/.cache/agl/bench)."
)
@click.option("--revision", default=None, help="Hub datasets: a branch, tag or commit (default: main).")
@click.option(
    "--archive",
    default=None,
    metavar="PATH|URL",
    help="Spider and QuixBugs: the release archive (spider_data.zip; QuixBugs' zip of its pinned commit), downloaded"
    " by hand or from a mirror (default: the official link).",
)
@click.option(
    "--force", is_flag=True, help="Fetch again, replacing what is there once the new copy has passed its checks."
)
def fetch_command(
    task_names: tuple[str, ...], into: str | None, revision: str | None, archive: str | None, force: bool
) -> None:
    """Download each TASK's data from its official source (the Hugging Face hub; Spider: its release archive;
    QuixBugs: its GitHub repository at a pinned commit), check it, and keep it where `agl bench eval/train` read it
    from."""
    from agl_bench.fetch import FetchError, fetch
    from agl_bench.sources import get_source

    for name in task_names:
        source = get_source(name)
        click.echo(f"{source.task}: from {source.origin.describe() if archive is None else archive} ({source.license})")
        try:
            fetch(
                name,
                into=Path(into) if into else None,
                revision=revision,
                archive=archive,
                force=force,
                progress=click.echo,
            )
        except FetchError as exc:
            raise click.ClickException(str(exc)) from exc


@data.command(name="show")
@click.option("--data", "data_dir", default=None, help="A folder to look at instead of the default places.")
def show_command(data_dir: str | None) -> None:
    """Where each task's data is read from, and where it came from."""
    from agl_bench.datasets import DataError, datasets_root
    from agl_bench.fetch import read_manifest

    for name in sorted(TASKS):
        try:
            folder = datasets_root(data_dir, name) / name
        except DataError as exc:
            click.echo(f"{name:<8} {exc}")
            continue
        manifest = read_manifest(folder)
        if manifest is None:
            click.echo(f"{name:<8} {folder} (a local folder; agl did not fetch it)")
            continue
        origin = manifest.get("source", {})
        where = origin.get("repo_id") or origin.get("url") or origin.get("path")
        at = f" @ {origin['commit'][:12]}" if origin.get("commit") else ""
        rows = ", ".join(f"{split} {n:,}" for split, n in manifest.get("rows", {}).items())
        click.echo(f"{name:<8} {folder}\n         from {where}{at}, fetched {manifest.get('fetched_at')}: {rows}")
