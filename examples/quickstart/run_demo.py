"""Quickstart: the whole agl platform on this machine, in about ten seconds.

Starts a scripted OpenAI-compatible backend (it stands in for a model server and returns token ids as vLLM
does), `agl serve` (store, proxy, traces), and two `agl worker` processes running the calculator agent of
`agent.py`; enqueues arithmetic tasks, waits with a progress bar, then shows what was recorded: one rollout
as a tree (`agl show`), and every LLM call with its exact token ids exported to JSONL, ready for training.

Usage: python examples/quickstart/run_demo.py [--tasks 16] [--group 2] [--run-dir runs/quickstart-<time>]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agl.client import Client
from agl.common.processes import start_server, start_worker, stop_processes
from agl.testing.upstream import start_upstream_process

HERE = Path(__file__).resolve().parent
console = Console()


def make_tasks(n: int, seed: int = 0) -> list[dict[str, object]]:
    rng = random.Random(seed)
    tasks = []
    for _ in range(n):
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        tasks.append({"question": f"What is {a}+{b}? Use the calculator.", "answer": a + b})
    return tasks


def cli(*args: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "agl.cli.main", *args], capture_output=True, text=True, check=True
    ).stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--group", type=int, default=2, help="rollouts per task")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--run-dir", type=Path, default=Path("runs") / f"quickstart-{time.strftime('%Y%m%d-%H%M%S')}")
    args = parser.parse_args()

    upstream, upstream_url = start_upstream_process()
    server = start_server(args.run_dir, upstream=upstream_url)
    workers = [
        start_worker(
            f"{HERE / 'agent.py'}:calc_agent", server.url, concurrency=4, log_path=args.run_dir / f"worker-{i}.log"
        )
        for i in range(args.workers)
    ]
    console.print(f"agl serve at {server.url}  (run directory {args.run_dir}, backend {upstream_url})")
    try:
        with Client(server.url) as client:
            t0 = time.perf_counter()
            ids = [r.id for task in make_tasks(args.tasks) for r in client.enqueue(task, n=args.group)]
            columns = (TextColumn("rollouts"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            with Progress(*columns, console=console) as progress:
                bar = progress.add_task("rollouts", total=len(ids))
                while True:
                    counts = client.stats()["rollouts_by_status"]
                    done = sum(counts.get(s, 0) for s in ("succeeded", "failed", "cancelled"))
                    progress.update(bar, completed=done)
                    if done >= len(ids):
                        break
                    time.sleep(0.1)
            elapsed = time.perf_counter() - t0
            rollouts = client.get_rollouts(ids)
            rewards = [r.final_reward for r in rollouts if r.final_reward is not None]
            export_path = args.run_dir / "llm_calls.jsonl"
            cli("export", f"--server={server.url}", f"--output={export_path}")
            calls = [json.loads(line) for line in export_path.read_text().splitlines()]

            console.rule("one rollout, as `agl show` prints it")
            console.print(cli("show", ids[0], f"--server={server.url}"), markup=False, highlight=False)
            console.rule("summary")
            succeeded = sum(r.status.value == "succeeded" for r in rollouts)
            console.print(
                f"rollouts: {succeeded}/{len(ids)} succeeded in {elapsed:.1f} s "
                f"({len(ids) / elapsed:.1f} rollouts/s with {args.workers} worker processes)"
            )
            console.print(f"mean final reward: {sum(rewards) / max(len(rewards), 1):.2f}")
            agents = sorted({c["agent_name"] for c in calls})
            tokens = sum(len(c["prompt_ids"]) + len(c["response_ids"]) for c in calls)
            console.print(
                f"trainable LLM calls exported: {len(calls)} (agents {agents}, {tokens} token ids) -> {export_path}"
            )
            console.print(
                f"store: {args.run_dir / 'agl.sqlite'}; to look around, reopen it with "
                f"`agl serve --run-dir {args.run_dir}`, then `agl rollouts` and `agl show <rollout id>`"
            )
    finally:
        stop_processes([*workers, upstream])
        server.stop()


if __name__ == "__main__":
    main()
