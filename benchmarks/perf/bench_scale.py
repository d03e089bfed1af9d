"""The proxy at scale: 16, 64, 256 and 1,024 agents at once against the scripted upstream (10-30 ms per answer).

Each concurrency runs rounds of the bare pass-through proxy (`_bare_proxy.py`: the same HTTP stack, forwarding
only) and of `agl serve`'s proxy, alternating, so that machine noise hits both alike. Printed per concurrency:
throughput and added p50 latency of each, their ratio (target ≥ 0.6 at 256 agents), the server's CPU per
proxied call (its user + system time over the proxied rounds) and its resident memory after them. Client,
upstream, bare proxy and server share the machine's cores: on 2 cores this is a worst case for the server.

    .venv/bin/python benchmarks/perf/bench_scale.py                 # every concurrency
    .venv/bin/python benchmarks/perf/bench_scale.py --profile 256   # and py-spy's profile of the server at 256

`--profile C` records the server with py-spy (installed with the dev tools) during the proxied rounds at
concurrency C and prints its 15 heaviest functions (by own time).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
from _common import median, report, upstream_and_server
from _loadgen import run_round
from bench_proxy import BODY, bare_proxy

CONCURRENCIES = (16, 64, 256, 1024)
TARGET_RATIO_256 = 0.6
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system seconds of a process so far (/proc/PID/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def one_concurrency(
    bare_url: str, proxy_url: str, pid: int, concurrency: int, n: int, rounds: int
) -> dict[str, float]:
    direct_body = orjson.dumps({**BODY, "return_token_ids": True, "logprobs": True})
    proxy_body = orjson.dumps(BODY)
    await run_round(bare_url, direct_body, min(n, 4 * concurrency), concurrency)  # warm both
    await run_round(proxy_url, proxy_body, min(n, 4 * concurrency), concurrency)
    lat: dict[str, list[float]] = {"bare": [], "proxy": []}
    elapsed = {"bare": 0.0, "proxy": 0.0}
    server_cpu = 0.0
    for _ in range(rounds):
        latencies, dt = await run_round(bare_url, direct_body, n, concurrency)
        lat["bare"] += latencies
        elapsed["bare"] += dt
        before = cpu_s(pid)
        latencies, dt = await run_round(proxy_url, proxy_body, n, concurrency)
        server_cpu += cpu_s(pid) - before
        lat["proxy"] += latencies
        elapsed["proxy"] += dt
    total = n * rounds
    return {
        "bare req/s": total / elapsed["bare"],
        "proxy req/s": total / elapsed["proxy"],
        "proxy/bare throughput": elapsed["bare"] / elapsed["proxy"],
        "bare p50 ms": median(lat["bare"]) * 1e3,
        "proxy p50 ms": median(lat["proxy"]) * 1e3,
        "added p50 ms": (median(lat["proxy"]) - median(lat["bare"])) * 1e3,
        "server CPU ms per call": server_cpu / total * 1e3,
        "server RSS MB": rss_mb(pid),
    }


def profiled(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes]:
    """py-spy recording the server for `seconds` (raw collapsed stacks, with each function's own time)."""
    spy = Path(sys.executable).with_name("py-spy")
    argv = [str(spy), "record", "--pid", str(pid), "--duration", str(int(seconds)), "--format", "raw"]
    return subprocess.Popen([*argv, "--output", str(out), "--nonblocking"], stdout=subprocess.DEVNULL)


def heaviest(raw: Path, top: int = 15) -> list[tuple[str, float]]:
    """The functions with the most samples on top of the stack, as shares of all samples."""
    own: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frame = stack.split(";")[-1]
        own[frame] = own.get(frame, 0) + int(count)
        total += int(count)
    return [(f, c / max(total, 1)) for f, c in sorted(own.items(), key=lambda kv: -kv[1])[:top]]


def main(
    concurrencies: tuple[int, ...] = CONCURRENCIES, n: int = 2000, rounds: int = 2, profile: int | None = None
) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    with (
        upstream_and_server(delay_s=0.02, delay_jitter=0.5) as (upstream_url, server),
        bare_proxy(upstream_url) as bare_url,
    ):
        httpx.post(f"{server.url}/api/v1/rollouts", json={"task": {"input": "bench"}}).raise_for_status()
        (claimed,) = httpx.post(f"{server.url}/api/v1/claims", json={"worker_id": "bench", "lease_s": 3600}).json()
        ids = f"rollout/{claimed['rollout']['id']}/attempt/{claimed['attempt']['id']}"
        proxy_url = f"{server.url}/{ids}/v1/chat/completions"
        pid = server.proc.pid
        for concurrency in concurrencies:
            calls = max(n, 4 * concurrency)
            spy = None
            raw = Path(tempfile.mkstemp(prefix="agl-scale-", suffix=".txt")[1])
            if profile == concurrency:
                spy = profiled(pid, 60, raw)
                time.sleep(1.0)
            result = asyncio.run(
                one_concurrency(f"{bare_url}/chat/completions", proxy_url, pid, concurrency, calls, rounds)
            )
            rows.update({f"c={concurrency}: {k}": v for k, v in result.items()})
            print(f"c={concurrency}: " + ", ".join(f"{k} {v:,.2f}" for k, v in result.items()), flush=True)
            if spy is not None:
                spy.terminate()
                spy.wait(30)
                for frame, share in heaviest(raw):
                    print(f"  {share:6.1%}  {frame}")
            raw.unlink(missing_ok=True)
        rows["calls stored by the proxy"] = httpx.get(f"{server.url}/api/v1/stats").json()["counts"]["llm_calls"]
    if 256 in concurrencies:
        rows[f"target: proxy/bare throughput at 256 agents ≥ {TARGET_RATIO_256}"] = (
            rows["c=256: proxy/bare throughput"] >= TARGET_RATIO_256
        )
    report("proxy_scale", rows)
    return rows


def smoke() -> None:
    """`make bench-smoke`: that this script runs, at a small size (the numbers are not judged)."""
    main(concurrencies=(16, 64), n=64, rounds=1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per round (at least 4 per agent)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--profile", type=int, default=None, help="profile the server at this concurrency")
    parser.add_argument("--concurrency", type=int, action="append", help="instead of 16, 64, 256 and 1,024")
    args = parser.parse_args()
    main(tuple(args.concurrency or CONCURRENCIES), n=args.calls, rounds=args.rounds, profile=args.profile)
