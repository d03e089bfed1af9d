"""Rollout workers on a Ray cluster (`agl worker --ray-address ADDR --workers N`, agl.capture.ray_workers): rollouts
per second with 1, 2 and 4 worker actors on a local cluster of two nodes (two `ray start` processes on this
machine, agl.testing.ray_cluster), each worker running 8 rollouts at once of an agent that makes one call through a
real `agl serve` to the scripted upstream, then waits `--wait` seconds (a tool run or a test: rollouts that wait
are what more workers serve; with no wait, every process shares this machine's two cores and more workers only add
contention); and the time from the command to its first claimed rollout (Ray's actors and the workers' start). Rounds: the rollouts are enqueued first, the command started, the clock read at
the first claim and when all have finished; then the command is interrupted and must leave no worker behind.

    python benchmarks/perf/bench_ray_workers.py                 # 1, 2, 4 workers, 240 rollouts each
    python benchmarks/perf/bench_ray_workers.py --workers 2 --rollouts 60
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from _common import scripted_upstream, serve

from agl.client import Client
from agl.testing.ray_cluster import ENV, command_lines, connected, two_nodes

AGENT = str(Path(__file__).with_name("ray_bench_agent.py")) + ":one_call"


def first_claimed(client: Client, ids: list[str]) -> bool:
    return any(r.status.value != "queued" for r in client.get_rollouts(ids[:50]))


def one_round(
    address: str, server_url: str, workers: int, rollouts: int, wait_s: float, logs: Path
) -> dict[str, object]:
    with Client(server_url) as client:
        ids = [client.enqueue({"n": i, "wait_s": wait_s})[0].id for i in range(rollouts)]
        command = [
            sys.executable, "-m", "agl.cli.main", "worker", AGENT, f"--server={server_url}",
            f"--ray-address={address}", f"--workers={workers}", "-n", "8", f"--log-dir={logs}",
        ]  # fmt: skip
        out = (logs / f"command-{workers}.log").open("wb")
        t0 = time.monotonic()
        proc = subprocess.Popen(command, env=ENV, stdout=out, stderr=subprocess.STDOUT)
        try:
            while not first_claimed(client, ids):
                if proc.poll() is not None or time.monotonic() - t0 > 300:
                    raise RuntimeError((logs / f"command-{workers}.log").read_text()[-3000:])
                time.sleep(0.1)
            started = time.monotonic()
            finished = client.wait(ids, timeout=900)
            took = time.monotonic() - started
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(120)
    left = [
        line for _, line in command_lines() if "agl.cli.main worker" in line and AGENT in line and "--ray-" not in line
    ]
    return {
        "workers": workers,
        "wait (s)": wait_s,
        "rollouts": rollouts,
        "succeeded": sum(r.status.value == "succeeded" for r in finished),
        "first claim (s)": round(started - t0, 1),
        "rollouts/s": round(rollouts / took, 1),
        "worker processes left": len(left),
    }


def run(worker_counts: list[int], rollouts: int, waits: list[float]) -> None:
    os.environ.update({k: v for k, v in ENV.items() if k.startswith("RAY_")})
    with (
        tempfile.TemporaryDirectory(prefix="agl-ray-bench-") as tmp,
        scripted_upstream() as upstream,
        two_nodes(Path(tmp), gpus=0, cpus=4) as address,
    ):
        with connected(address):
            pass
        for wait_s in waits:
            rows = []
            for workers in worker_counts:
                with serve(upstream=upstream) as server:
                    httpx.get(f"{server.url}/healthz").raise_for_status()
                    row = one_round(address, server.url, workers, rollouts, wait_s, Path(tmp))
                print(json.dumps(row), flush=True)
                rows.append(row)
            base = float(str(rows[0]["rollouts/s"]))
            for row in rows[1:]:
                ratio = float(str(row["rollouts/s"])) / base
                print(f"wait {wait_s:g} s: {row['workers']} workers / {rows[0]['workers']}: ×{ratio:.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rollouts", type=int, default=240)
    parser.add_argument("--wait", type=float, nargs="+", default=[0.0, 1.0], help="seconds each rollout waits")
    args = parser.parse_args()
    run(args.workers, args.rollouts, args.wait)


def smoke() -> None:
    """`make bench-smoke`: that this script runs, at a small size (the numbers are not judged)."""
    run([1], 8, [0.0])


if __name__ == "__main__":
    main()
