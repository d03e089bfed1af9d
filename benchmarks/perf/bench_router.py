"""The proxy over several engines (agl.server.engines, issue #42): how throughput grows with the engines when they
are the bottleneck, and what the router itself costs per call.

- **Scaling**: 1, 2, 4 and 8 engines of fixed capacity behind one real `agl serve` (`--upstream` repeated: 8 is a
  node of 8 GPUs with a vLLM server per GPU, as agl runs LoRA over data-parallel ranks). Each
  engine is the scripted upstream (its own process) that generates at most `--slots` answers at once, each taking
  `--latency-ms`, the others waiting for a slot, as a GPU engine with a full batch makes calls wait. `--clients`
  agents (each its own attempt, so the router spreads attempts, not calls) call one after another for `--seconds`;
  calls per second, and the ratio to one engine. Targets: ≥ 1.9× with 2 engines, ≥ 3.6× with 4, ≥ 7.2× with 8.
  The agents are at least twice the engines' slots (`--clients`), so that every engine stays busy.
- **The router's cost per call**: `EngineRouter.pick` and the engine's meter in and out, in this process, per call
  of an attempt (its own engine, looked up) and per first call (the least busy engine chosen), with 1, 2, 4 and 8
  engines. Target: under 0.1 ms at the median.

    python benchmarks/perf/bench_router.py                   # 1, 2, 4, 8 engines
    python benchmarks/perf/bench_router.py --engines 1 2 --seconds 3
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import httpx
from _common import percentile, report, serve

from agl.common.processes import read_ready_line
from agl.server.engines import EngineRouter
from agl.testing.upstream import READY_MARKER

# the scripted upstream, with a cap on the answers it generates at once (the rest wait for a slot)
_ENGINE = """
import asyncio, sys
from agl.common import asgi
from agl.testing.upstream import READY_MARKER, ScriptedUpstream

slots, delay = int(sys.argv[1]), float(sys.argv[2])
inner = ScriptedUpstream(delay_s=delay)
gate = None

async def app(scope, receive, send):
    global gate
    if scope["type"] == "http" and scope["path"].endswith("/chat/completions"):
        gate = gate or asyncio.Semaphore(slots)
        async with gate:
            await inner(scope, receive, send)
    else:
        await inner(scope, receive, send)

sock = asgi.bind("127.0.0.1", 0)
print(f"{READY_MARKER} {asgi.url_of(sock)}/v1", flush=True)
asgi.serve(app, sock, lifespan="on")
"""


@contextmanager
def engine(slots: int, latency_s: float) -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _ENGINE, str(slots), str(latency_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        yield read_ready_line(proc, READY_MARKER, 60)
    finally:
        proc.terminate()
        proc.wait(10)


async def drive(server_url: str, clients: int, seconds: float) -> tuple[int, list[float]]:
    """`clients` agents, each its own attempt, calling one after another: (calls answered in `seconds`, latencies)."""
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        bases = []
        for _ in range(clients):
            await http.post(f"{server_url}/api/v1/rollouts", json={"task": {"input": "q"}})
            (c,) = (await http.post(f"{server_url}/api/v1/claims", json={"worker_id": "w", "lease_s": 3600})).json()
            bases.append(f"{server_url}/rollout/{c['rollout']['id']}/attempt/{c['attempt']['id']}/v1")
        body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "say three words"}]}
        latencies: list[float] = []
        deadline = 0.0

        async def agent(base: str, warmup_until: float) -> int:
            done = 0
            while (now := time.monotonic()) < deadline:
                resp = await http.post(f"{base}/chat/completions", json=body)
                resp.raise_for_status()
                if now >= warmup_until:
                    done += 1
                    latencies.append(time.monotonic() - now)
            return done

        warmup = 1.0
        start = time.monotonic()
        deadline = start + warmup + seconds
        counts = await asyncio.gather(*(agent(b, start + warmup) for b in bases))
        return sum(counts), latencies


def scaling(engines: list[int], slots: int, latency_s: float, clients: int, seconds: float) -> dict[str, Any]:
    rows: dict[str, Any] = {"engine slots": slots, "engine latency (ms)": latency_s * 1e3, "agents": clients}
    per_s: dict[int, float] = {}
    for n in engines:
        with ExitStack() as stack:
            urls = [stack.enter_context(engine(slots, latency_s)) for _ in range(n)]
            server = stack.enter_context(serve(extra=tuple(f"--upstream={u}" for u in urls)))
            calls, latencies = asyncio.run(drive(server.url, clients, seconds))
            used = httpx.get(f"{server.url}/api/v1/proxy/engines").json()
        per_s[n] = calls / seconds
        rows[f"{n} engine(s): calls/s"] = per_s[n]
        rows[f"{n} engine(s): capacity, calls/s"] = n * slots / latency_s
        rows[f"{n} engine(s): latency p50 / p99 (ms)"] = (
            f"{percentile(latencies, 0.5) * 1e3:.1f} / {percentile(latencies, 0.99) * 1e3:.1f}"
        )
        rows[f"{n} engine(s): calls per engine"] = ", ".join(str(e["calls"]) for e in used)
    for n in engines:
        if n > 1 and 1 in per_s:
            rows[f"{n} engines / 1: throughput ×"] = per_s[n] / per_s[1]
    return rows


def router_cost(engines: list[int], calls: int = 100_000) -> dict[str, Any]:
    """The router's own work per call, timed call by call (perf_counter_ns), in this process."""
    rows: dict[str, Any] = {}
    for n in engines:
        router = EngineRouter([f"http://engine-{i}/v1" for i in range(n)])
        for kind in ("first call of an attempt", "later call of an attempt"):
            times: list[float] = []
            for i in range(calls):
                attempt = f"attempt-{i}" if kind.startswith("first") else f"attempt-{i % 1000}"
                t0 = time.perf_counter_ns()
                chosen = router.pick(attempt)
                assert chosen is not None
                chosen.meter.enter(i)
                chosen.meter.leave(i, 4)
                times.append((time.perf_counter_ns() - t0) / 1e3)
            rows[f"{n} engine(s), {kind}: µs p50 / p99"] = (
                f"{percentile(times, 0.5):.2f} / {percentile(times, 0.99):.2f}"
            )
            rows[f"{n} engine(s), {kind}: meets < 100 µs p50"] = percentile(times, 0.5) < 100
    return rows


def smoke() -> None:
    report("router_scaling_smoke", scaling([1, 2], slots=2, latency_s=0.05, clients=8, seconds=2.0))
    report("router_cost_smoke", router_cost([1, 2], calls=20_000))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--slots", type=int, default=2, help="answers an engine generates at once")
    parser.add_argument("--latency-ms", type=float, default=50.0, help="the time each answer takes")
    parser.add_argument(
        "--clients", type=int, help="agents calling at once, each its own attempt (default: 16, or twice the slots)"
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="measured time per configuration")
    args = parser.parse_args()
    # fewer agents than slots would leave engines idle and measure the agents, not the router
    clients = args.clients or max(16, 2 * args.slots * max(args.engines))
    rows = scaling(args.engines, args.slots, args.latency_ms / 1e3, clients, args.seconds)
    rows.update({"target: 2 engines ≥ ×": 1.9, "target: 4 engines ≥ ×": 3.6, "target: 8 engines ≥ ×": 7.2})
    report("router_scaling", rows)
    report("router_cost", router_cost(args.engines))


if __name__ == "__main__":
    main()
