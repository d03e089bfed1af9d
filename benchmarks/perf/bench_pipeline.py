"""Rollouts overlapping updates (`max_staleness`, issue #32): the real training loop, timed with stand-ins of fixed
cost for the two things it overlaps.

- The engine: the scripted upstream answering every call after `--gen-delay` seconds (it sleeps: it takes no CPU,
  like a GPU engine seen from this machine). The agent is `agents.py:three_calls`, 3 calls per rollout.
- The update: a policy whose update sleeps `--update-s` seconds (and whose weights never change). Like vLLM with
  LoRA, the engine keeps serving the previous version while the next one loads, so no call is held.

Everything else is the real loop: `agl serve` with its store and proxy, `agl worker` processes, the step's
trainable read, AIR, credit assignment, the staleness filter, publication, metrics and the curve.

For each K in 0, 1, 2 it reports the throughput (transitions given to the update per minute, from the end of the
second step to the end of the last, so the pipeline's start and matplotlib's import are left out), and the ideal bound
`transitions per step / max(gen, update)`, with `gen` the time one step's rollouts take alone (the K = 0 run's
rollout wait). Goals: K = 1 within 15 % of the bound, and ≥ 1.4 × K = 0 when generation and update take equal
time (`--update-s` = the measured `gen`, which the script finds first: `--update-s auto`).

    python benchmarks/perf/bench_pipeline.py [--steps 8] [--gen-delay 1.0] [--update-s auto] [--ks 0,1,2]
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from _common import report

from agl.learn.transitions import Transition
from agl.testing.upstream import start_upstream_process
from agl_trainer.backends import UpdateStats
from agl_trainer.config import TrainConfig
from agl_trainer.run.loop import TrainingRun
from agl_trainer.tracking.metrics import MetricsLog

AGENT = str(Path(__file__).resolve().parent / "agents.py") + ":three_calls"
CALLS_PER_ROLLOUT = 3


class FixedCostPolicy:
    """An update that takes `seconds` and changes nothing: the trainer's side at a known cost."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def update(self, transitions: Sequence[Transition]) -> UpdateStats:
        time.sleep(self.seconds)
        return UpdateStats(transitions=len(transitions), tokens=sum(t.n_tokens for t in transitions))

    def save(self, path: str | Path) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)

    def load(self, path: str | Path) -> None:
        pass


class FixedLatencyEngine:
    """The engine side: the scripted upstream serves; a new version needs nothing written or loaded."""

    serves_previous_version_while_loading = True

    def stage(self) -> None:
        pass

    def serve(self) -> None:
        pass

    def weights_changed(self) -> None:
        pass

    def close(self) -> None:
        pass


class PipelineRun(TrainingRun):
    """The training loop with FixedCostPolicy and the scripted upstream in place of the model's trainer and engine."""

    def __init__(self, config: TrainConfig, upstream: str, update_s: float) -> None:
        super().__init__(config)
        self.upstream = upstream
        self.update_s = update_s

    def _open_backends(self, path: Path, stack: ExitStack) -> tuple[str, str]:
        self.policy = FixedCostPolicy(self.update_s)  # type: ignore[assignment]
        self.inference = FixedLatencyEngine()  # type: ignore[assignment]
        self.weights_lock = contextlib.nullcontext()
        self.upstream_model = None
        return self.upstream, f"scripted upstream at {self.upstream}"


def config(run_dir: Path, k: int, steps: int, tasks_per_step: int, concurrency: int) -> TrainConfig:
    return TrainConfig(
        agent=AGENT,
        train_tasks=[f"t{i}" for i in range(64)],
        eval_tasks=["e0"],
        run_dir=run_dir,
        device="cpu",
        steps=steps,
        tasks_per_step=tasks_per_step,
        group_size=4,
        eval_every=steps,
        checkpoint_every=steps,
        workers=1,
        concurrency=concurrency,
        rollout_timeout_s=120,
        max_staleness=k,
    )


MIN_STEPS = 3


def run_k(
    k: int, upstream: str, update_s: float, root: Path, steps: int, tasks: int, concurrency: int
) -> dict[str, Any]:
    run_dir = root / f"k{k}-u{update_s:.2f}"
    PipelineRun(config(run_dir, k, steps, tasks, concurrency), upstream, update_s).run()
    train = [r for r in MetricsLog(run_dir).rows() if r["kind"] == "train"]
    # from the end of step 2 on: step 1 fills the pipeline, and the first curve drawn after it imports matplotlib
    window_min = train[-1]["elapsed_min"] - train[1]["elapsed_min"]
    steady = train[2:]
    return {
        "transitions_per_min": sum(r["transitions"] for r in steady) / window_min,
        "transitions_per_step": sum(r["transitions"] for r in steady) / len(steady),
        "rollout_wait_s": sum(r["rollout_wait_s"] for r in steady) / len(steady),
        "step_s": window_min * 60 / len(steady),
        "engine_busy": sum(r["engine_busy"] for r in steady) / len(steady),
        "trainer_busy": sum(r["trainer_busy"] for r in steady) / len(steady),
        "staleness": {a: sum(r["staleness"].get(a, 0) for r in train) for a in ("0", "1", "2")},
        "failed": sum(r["failed"] for r in train),
    }


def main(
    steps: int = 8,
    gen_delay: float = 1.0,
    update_s: float | None = None,
    ks: Sequence[int] = (0, 1, 2),
    tasks_per_step: int = 4,
    concurrency: int = 16,
) -> dict[str, Any]:
    if steps < MIN_STEPS:  # the throughput is measured over the steps after the first two (run_k)
        raise SystemExit(
            f"--steps {steps}: at least {MIN_STEPS} (step 1 fills the pipeline; from step 3 on is measured)"
        )
    proc, upstream = start_upstream_process(delay_s=gen_delay)
    rows: dict[str, Any] = {
        "engine latency per call (s)": gen_delay,
        "rollouts per step": tasks_per_step * 4,
        "calls per rollout": CALLS_PER_ROLLOUT,
    }
    try:
        with tempfile.TemporaryDirectory(prefix="agl-bench-pipeline-") as tmp:
            root = Path(tmp)
            if update_s is None:  # equal generation and update: measure gen first with K = 0 and no update
                probe = run_k(0, upstream, 0.0, root, max(4, steps // 2), tasks_per_step, concurrency)
                update_s = probe["rollout_wait_s"]
            rows["update (s, fixed)"] = update_s
            results = {k: run_k(k, upstream, update_s, root, steps, tasks_per_step, concurrency) for k in ks}
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
    gen = results[0]["rollout_wait_s"] if 0 in results else update_s
    per_step = max(r["transitions_per_step"] for r in results.values())
    bound = per_step / max(gen, update_s) * 60
    rows["gen: one step's rollouts alone (s, K=0's wait)"] = gen
    rows["bound: transitions/min at max(gen, update)"] = bound
    for k, r in results.items():
        rows[f"K={k}: transitions/min"] = r["transitions_per_min"]
        rows[f"K={k}: of the bound"] = r["transitions_per_min"] / bound
        rows[f"K={k}: step (s)"] = r["step_s"]
        rows[f"K={k}: rollout wait (s)"] = r["rollout_wait_s"]
        rows[f"K={k}: engine busy"] = r["engine_busy"]
        rows[f"K={k}: trainer busy"] = r["trainer_busy"]
        rows[f"K={k}: transitions by staleness 0/1/2"] = "/".join(str(r["staleness"][a]) for a in ("0", "1", "2"))
        rows[f"K={k}: failed rollouts"] = r["failed"]
    if 0 in results:
        for k in results:
            if k:
                rows[f"K={k} / K=0"] = results[k]["transitions_per_min"] / results[0]["transitions_per_min"]
    report("pipeline", rows)
    return rows


def smoke() -> None:
    """`make bench-smoke`: that this script runs, at a small size (the numbers are not judged)."""
    rows = main(steps=3, gen_delay=0.2, update_s=0.2, ks=(0, 1), tasks_per_step=2, concurrency=8)
    if rows["K=0: failed rollouts"] or rows["K=1: failed rollouts"]:
        raise RuntimeError(f"rollouts failed: {rows}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--gen-delay", type=float, default=1.0, help="seconds per LLM call")
    parser.add_argument("--update-s", default="auto", help="seconds per update; auto: as long as one step's rollouts")
    parser.add_argument("--ks", default="0,1,2")
    parser.add_argument("--tasks-per-step", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    main(
        args.steps,
        args.gen_delay,
        None if args.update_s == "auto" else float(args.update_s),
        tuple(int(k) for k in args.ks.split(",")),
        args.tasks_per_step,
        args.concurrency,
    )
