"""End to end: 4 `agl worker` processes run an agent that makes 3 LLM calls through the proxy (against an
instant scripted upstream) and emits a reward. Target: ≥ 50 rollouts/s in total.

The clock runs from the enqueue of the measured batch to the moment all its rollouts are finished; a
warm-up batch runs first so that process start-up is not counted.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx
from _common import report, upstream_and_server

from agl.client import Client
from agl.testing.processes import start_worker

AGENT = str(Path(__file__).resolve().parent / "agents.py") + ":three_calls"


def run_batch(client: Client, n: int, timeout: float = 600) -> float:
    t0 = time.perf_counter()
    ids = [r.id for r in client.enqueue({"question": "bench"}, n=n)]
    deadline = time.monotonic() + timeout
    while True:
        counts = client.stats()["rollouts_by_status"]
        if counts.get("queued", 0) == 0 and counts.get("running", 0) == 0:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"rollouts not finished after {timeout} s: {counts}")
        time.sleep(0.05)
    elapsed = time.perf_counter() - t0
    bad = [r for r in client.get_rollouts(ids) if r.status.value != "succeeded"]
    if bad:
        raise RuntimeError(f"{len(bad)} rollouts did not succeed, e.g. {bad[0]}")
    return elapsed


def main(n: int = 1000, processes: int = 4, concurrency: int = 16) -> dict[str, object]:
    rows: dict[str, object] = {
        "worker processes": processes,
        "rollouts at once per process": concurrency,
        "rollouts": n,
    }
    with upstream_and_server() as (_, server):
        workers: list[subprocess.Popen[bytes]] = [
            start_worker(AGENT, server.url, concurrency=concurrency, extra_args=["--heartbeat=2"])
            for _ in range(processes)
        ]
        try:
            with Client(server.url) as client:
                run_batch(client, 4 * processes * concurrency)  # warm-up: processes started, imports done
                elapsed = run_batch(client, n)
                stats = httpx.get(f"{server.url}/api/v1/stats").json()["counts"]
        finally:
            for w in workers:
                w.terminate()
            for w in workers:
                w.wait(15)
    rows["rollouts/s"] = n / elapsed
    rows["LLM calls/s through the proxy"] = 3 * n / elapsed
    rows["LLM calls stored"] = stats["llm_calls"]
    rows["rewards stored"] = stats["rewards"]
    rows["target: rollouts/s ≥"] = 50
    rows["meets target"] = n / elapsed >= 50
    report("end_to_end", rows)
    return rows


if __name__ == "__main__":
    main()
