"""`agl bench eval`: run a task's agent over a split with any model, through the real platform, and score it.

    model  ─ embedded / a model folder → an `agl engine` child process, or with `engine="vllm"` a vLLM server
           │                             agl starts from its own environment (`make vllm`)
           └ an http(s) URL            → that OpenAI-compatible endpoint (vLLM, a hosted API)
    decoding: greedy (the proxy sends evaluation calls with temperature 0, whatever the agent asks)
    agl serve (store in OUT/, proxy to the model) ← agl worker × W (the task's agent) ← one eval rollout per row
    → each rollout's `bench:result` outcome → per-row results + mean of every metric → OUT/results.json

A rollout that fails, or ends without reporting, scores 0 on every metric and is counted, never dropped.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from agl.client import Client
from agl.common.processes import start_server, start_worker, stop_processes
from agl.schema import RolloutDetail
from agl_bench.results import read_outcome
from agl_bench.task import BenchTask
from agl_trainer.run.waiting import wait_for_rollouts
from agl_trainer.run.worker_pool import LocalWorkers

EMBEDDED = ("embedded", "bundled")


@dataclass
class ModelSpec:
    """What `--model` named: the embedded engine (bundled model or a local folder) or a remote endpoint."""

    name: str
    endpoint_model: str | None = None  # the model name to ask a remote endpoint for
    api_key_env: str = "OPENAI_API_KEY"
    device: str = "auto"
    max_batch: int = 8
    engine: str = "embedded"  # or "vllm" (for the bundled model or a model folder)
    vllm_python: str | None = None  # the python of vLLM's environment; None: $AGL_VLLM_PYTHON, else .venv-vllm

    @property
    def is_remote(self) -> bool:
        return self.name.startswith(("http://", "https://"))


@dataclass
class EvalConfig:
    task: BenchTask
    split: str
    rows: list[dict[str, Any]]
    model: ModelSpec
    out_dir: Path
    workers: int = 1
    concurrency: int = 8
    rollout_timeout_s: float = 900.0
    max_attempts: int = 1  # a benchmark scores the first answer: a retry would be a second try at the question
    stall_margin_s: float = 300.0  # the wait gives up when nothing finished for a rollout's time limit plus this


@dataclass
class RowResult:
    id: str
    status: str
    metrics: dict[str, float]
    prediction: str | None = None
    gold: str | None = None
    error: str | None = None
    llm_calls: int = 0
    agents: dict[str, int] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class EvalReport:
    task: str
    split: str
    model: str
    n: int
    metrics: dict[str, float]  # mean over all rows; failed rows count as 0
    failed: int
    no_outcome: int
    llm_calls_per_rollout: float
    minutes: float
    rows: list[RowResult]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def start_model(
    spec: ModelSpec, stack: ExitStack, log_dir: Path, console: Console
) -> tuple[str, str | None, str | None]:
    """The upstream URL the proxy forwards to, the model name to ask it for (None: the proxy's default), and the
    key the engine asks for (a vLLM server agl starts asks for one on every route: agl_vllm_gate)."""
    if spec.is_remote:
        return spec.name.rstrip("/"), spec.endpoint_model, None
    model = "bundled" if spec.name in EMBEDDED else spec.name
    if model != "bundled" and not (Path(model) / "config.json").exists():
        raise ValueError(f"--model {spec.name!r} is neither 'embedded', an http(s) URL, nor a model folder")
    if spec.engine == "vllm":
        return _start_vllm(spec, model, stack, log_dir, console)
    from agl_trainer.engines.remote import agl_engine

    console.print(f"starting agl engine ({model}); its log: {log_dir / 'engine.log'}")
    engine = agl_engine(
        model, device=spec.device, max_batch=spec.max_batch, log_path=log_dir / "engine.log", timeout_s=600
    )
    return stack.enter_context(engine), None, None


def _start_vllm(
    spec: ModelSpec, model: str, stack: ExitStack, log_dir: Path, console: Console
) -> tuple[str, str, str | None]:
    from transformers import AutoTokenizer

    from agl_trainer.engines.remote import start_vllm
    from agl_trainer.engines.vllm_server import SERVED_BASE
    from agl_trainer.models import pick_device, resolve_model

    path = resolve_model(model)
    device = pick_device(spec.device)
    server = start_vllm(
        path,
        AutoTokenizer.from_pretrained(path),
        log_path=log_dir / "vllm.log",
        python=spec.vllm_python,
        dtype="float32" if device == "cpu" else "bfloat16",
        device=device,
        console=console,
    )
    stack.callback(server.stop)
    return server.url, SERVED_BASE, server.settings.api_key


def run_eval(cfg: EvalConfig, console: Console | None = None) -> EvalReport:
    console = console or Console()
    if not cfg.rows:
        raise ValueError(f"split {cfg.split!r} of {cfg.task.name} holds no rows")
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    logs = cfg.out_dir / "logs"
    logs.mkdir(exist_ok=True)
    t0 = time.monotonic()
    with ExitStack() as stack:
        upstream, endpoint_model, engine_key = start_model(cfg.model, stack, logs, console)
        # greedy decoding for every backend: agl's engine does it from the rollout mode, others are told so
        extra = ["--log-level=warning", "--eval-temperature=0"]
        if endpoint_model:
            extra.append(f"--upstream-model={endpoint_model}")
        env = {}
        if cfg.model.is_remote and os.environ.get(cfg.model.api_key_env):
            env["AGL_UPSTREAM_API_KEY"] = os.environ[cfg.model.api_key_env]
        if engine_key:  # the vLLM server started here: its key reaches the proxy in its environment
            env["AGL_UPSTREAM_API_KEY"] = engine_key
        server = start_server(cfg.out_dir, upstream=upstream, extra_args=extra, env=env)
        stack.callback(server.stop)
        workers = [
            start_worker(cfg.task.agent, server.url, concurrency=cfg.concurrency, log_path=logs / f"worker-{i}.log")
            for i in range(cfg.workers)
        ]
        for w in workers:
            stack.callback(stop_processes, [w])
        client = stack.enter_context(Client(server.url))
        ids = [
            r.id
            for row in cfg.rows
            for r in client.enqueue(
                row, n=1, mode="eval", max_attempts=cfg.max_attempts, timeout_s=cfg.rollout_timeout_s
            )
        ]
        wait_for_rollouts(
            client,
            ids,
            label=f"{cfg.task.name} {cfg.split}",
            console=console,
            stall_s=cfg.rollout_timeout_s * cfg.max_attempts + cfg.stall_margin_s,
            workers=LocalWorkers(workers),
            logs=logs,
        )
        details = client.rollout_details(ids)
    rows = [_row_result(d, cfg.task) for d in details]
    report = _summarise(cfg, rows, (time.monotonic() - t0) / 60)
    (cfg.out_dir / "results.json").write_text(json.dumps(report.to_json(), indent=2))
    return report


def _row_result(detail: RolloutDetail, task: BenchTask) -> RowResult:
    rollout = detail.rollout
    calls = [c for c in detail.llm_calls if c.attempt_id == rollout.final_attempt_id]
    agents: dict[str, int] = {}
    for call in calls:
        name = call.agent_name or "(unattributed)"
        agents[name] = agents.get(name, 0) + 1
    outcome = read_outcome(detail)
    task_input = detail.task.input if isinstance(detail.task.input, dict) else {}
    metrics = {m: 0.0 for m in task.metrics}
    if outcome is not None:
        metrics.update(outcome.metrics)
    return RowResult(
        id=str(task_input.get("id", rollout.task_id)),
        status=rollout.status.value if outcome is not None else f"{rollout.status.value} (no outcome)",
        metrics=metrics,
        prediction=outcome.prediction if outcome else None,
        gold=outcome.gold if outcome else None,
        error=rollout.error,
        llm_calls=len(calls),
        agents=agents,
        info=outcome.info if outcome else {},
    )


def _summarise(cfg: EvalConfig, rows: list[RowResult], minutes: float) -> EvalReport:
    n = len(rows)
    names = list(dict.fromkeys([*cfg.task.metrics, *(k for r in rows for k in r.metrics)]))
    return EvalReport(
        task=cfg.task.name,
        split=cfg.split,
        model=cfg.model.name if not cfg.model.endpoint_model else f"{cfg.model.name} ({cfg.model.endpoint_model})",
        n=n,
        metrics={m: sum(r.metrics.get(m, 0.0) for r in rows) / n for m in names},
        failed=sum(r.status.startswith("failed") for r in rows),
        no_outcome=sum("no outcome" in r.status for r in rows),
        llm_calls_per_rollout=sum(r.llm_calls for r in rows) / n,
        minutes=minutes,
        rows=rows,
    )


def results_table(report: EvalReport) -> Table:
    table = Table(title=f"agl bench eval · {report.task} ({report.split}) · {report.model}")
    table.add_column("metric")
    table.add_column("mean", justify="right")
    for name, value in report.metrics.items():
        table.add_row(name, f"{value:.4f}")
    table.add_row("rows", str(report.n))
    table.add_row("failed rollouts (scored 0)", str(report.failed))
    table.add_row("rollouts without an outcome", str(report.no_outcome))
    table.add_row("LLM calls per rollout", f"{report.llm_calls_per_rollout:.2f}")
    table.add_row("minutes", f"{report.minutes:.1f}")
    return table
