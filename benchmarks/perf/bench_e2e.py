"""End to end: 4 `agl worker` processes run an agent that makes 3 LLM calls through the proxy (against an
instant scripted upstream) and emits a reward. Target: ≥ 50 rollouts/s in total.

The clock runs from the enqueue of the measured batch to the moment all its rollouts are finished; a
warm-up batch runs first so that process start-up is not counted. The agent is measured twice: with a client
from `llm.async_openai_client()` (one connection pool per process) and building a new `openai.AsyncOpenAI`
per rollout, which costs 20-40 ms of CPU each time and on 2 cores dominates everything else.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx
from _common import report, upstream_and_server

from agl.client import Client
from agl.common.processes import start_worker

AGENTS = Path(__file__).resolve().parent / "agents.py"


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


def measure(server_url: str, agent: str, n: int, processes: int, concurrency: int) -> float:
    """Rollouts/s of `agent` run by fresh worker processes, after a warm-up batch."""
    workers: list[subprocess.Popen[bytes]] = [
        start_worker(f"{AGENTS}:{agent}", server_url, concurrency=concurrency, extra_args=["--heartbeat=2"])
        for _ in range(processes)
    ]
    try:
        with Client(server_url) as client:
            run_batch(client, 4 * processes * concurrency)  # warm-up: processes started, imports done
            return n / run_batch(client, n)
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait(15)


def main(n: int = 1000, processes: int = 4, concurrency: int = 16) -> dict[str, object]:
    rows: dict[str, object] = {
        "worker processes": processes,
        "rollouts at once per process": concurrency,
        "rollouts per measurement": n,
    }
    with upstream_and_server() as (_, server):
        shared = measure(server.url, "three_calls", n, processes, concurrency)
        fresh = measure(server.url, "three_calls_fresh_client", n, processes, concurrency)
        stats = httpx.get(f"{server.url}/api/v1/stats").json()["counts"]
    rows["rollouts/s, shared OpenAI client (llm.async_openai_client)"] = shared
    rows["LLM calls/s through the proxy, shared client"] = 3 * shared
    rows["rollouts/s, new OpenAI client per rollout"] = fresh
    rows["LLM calls stored (all batches)"] = stats["llm_calls"]
    rows["rewards stored (all batches)"] = stats["rewards"]
    rows["target: rollouts/s ≥"] = 50
    rows["meets target"] = shared >= 50  # with the shared client, the documented way
    report("end_to_end", rows)
    return rows


def smoke() -> None:
    """`make bench-smoke`: that this script runs, at a small size (the numbers are not judged)."""
    main(n=20, processes=1, concurrency=4)


if __name__ == "__main__":
    main()
