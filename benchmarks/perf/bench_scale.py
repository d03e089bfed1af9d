"""The proxy at scale: 16, 64, 256 and 1,024 agents at once against the scripted upstream (10-30 ms per answer).

Each concurrency runs rounds of the bare pass-through proxy (`_bare_proxy.py`: the same HTTP stack, forwarding
only) and of `agl serve`'s proxy, alternating, so that machine noise hits both alike. Printed per concurrency:
throughput and added p50 latency of each, their ratio (target ≥ 0.6 at 256 agents), the server's CPU per
proxied call (its user + system time over the proxied rounds) and its resident memory after them. Client,
upstream, bare proxy and server share the machine's cores: on 2 cores this is a worst case for the server.

    .venv/bin/python benchmarks/perf/bench_scale.py                 # every concurrency
    .venv/bin/python benchmarks/perf/bench_scale.py --profile 256   # and py-spy's profile of the server at 256

`--profile C` runs only concurrency C, against a server sampled by py-spy (every thread), and prints where its
samples were: the functions by own time, and by inclusive time.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
from _common import cpu_clock, median, report, status_mb, upstream_and_server
from _loadgen import run_round
from bench_proxy import BODY, bare_proxy_process

from agl.common.processes import read_ready_line

CONCURRENCIES = (16, 64, 256, 1024)
TARGET_RATIO_256 = 0.6


async def one_concurrency(
    bare: tuple[str, int], proxy_url: str, pid: int, concurrency: int, n: int, rounds: int
) -> dict[str, float]:
    """Rounds of `n` calls over `concurrency` connections, the bare proxy's (its URL and pid) and agl's alternating."""
    bare_url, bare_pid = bare
    bare_cpu_s, server_cpu_s = cpu_clock(bare_pid), cpu_clock(pid)
    direct_body = orjson.dumps({**BODY, "return_token_ids": True, "logprobs": True})
    proxy_body = orjson.dumps(BODY)
    await run_round(bare_url, direct_body, min(n, 4 * concurrency), concurrency)  # warm both
    await run_round(proxy_url, proxy_body, min(n, 4 * concurrency), concurrency)
    lat: dict[str, list[float]] = {"bare": [], "proxy": []}
    elapsed = {"bare": 0.0, "proxy": 0.0}
    server_cpu = bare_cpu = 0.0
    for _ in range(rounds):
        before = bare_cpu_s()
        latencies, dt = await run_round(bare_url, direct_body, n, concurrency)
        bare_cpu += bare_cpu_s() - before
        lat["bare"] += latencies
        elapsed["bare"] += dt
        before = server_cpu_s()
        latencies, dt = await run_round(proxy_url, proxy_body, n, concurrency)
        server_cpu += server_cpu_s() - before
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
        "bare proxy CPU ms per call": bare_cpu / total * 1e3,
        "server RSS MB": status_mb(pid),
    }


@contextmanager
def profiled_server(upstream_url: str, out: Path) -> Iterator[tuple[str, int]]:
    """`agl serve` started by py-spy (which samples every thread; attaching to a running server is refused, as its
    process is not dumpable), forwarding to `upstream_url`: its URL and pid; the samples are in `out` after."""
    spy = Path(sys.executable).with_name("py-spy")
    with tempfile.TemporaryDirectory(prefix="agl-scale-") as tmp:
        serve = [sys.executable, "-m", "agl.cli.main", "serve", f"--run-dir={tmp}/run", "--port=0"]
        argv = [str(spy), "record", "--format", "raw", "--rate", "250", "--threads", "--nonblocking", "-o", str(out)]
        proc = subprocess.Popen(
            [*argv, "--", *serve, f"--upstream={upstream_url}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            url = read_ready_line(proc, "AGL_SERVER_READY", 60)
            yield url, int(subprocess.check_output(["pgrep", "-P", str(proc.pid)], text=True).split()[0])
        finally:
            proc.send_signal(signal.SIGINT)  # py-spy stops its child and writes what it sampled
            proc.wait(120)


def profile_at(concurrency: int, n: int, rounds: int, top: int = 30) -> None:
    """The proxied rounds at `concurrency` against a server sampled by py-spy: the functions the most samples were
    in (own time), and the share of samples under each of agl's stages (inclusive)."""
    out = Path(tempfile.mkstemp(prefix="agl-scale-", suffix=".txt")[1])
    with (
        upstream_and_server(delay_s=0.02, delay_jitter=0.5) as (upstream_url, _),
        bare_proxy_process(upstream_url) as (bare_url, bare_pid),
        profiled_server(upstream_url, out) as (url, pid),
    ):
        proxy_url = f"{url}/{attempt_path(url)}/v1/chat/completions"
        bare = (f"{bare_url}/chat/completions", bare_pid)
        result = asyncio.run(one_concurrency(bare, proxy_url, pid, concurrency, n, rounds))
        print(f"sampled, c={concurrency}: " + ", ".join(f"{k} {v:,.2f}" for k, v in result.items()), flush=True)
    own: dict[str, int] = {}
    under: dict[str, int] = {}
    total = 0
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        own[frames[-1]] = own.get(frames[-1], 0) + int(count)
        for mark in {f.split(" (")[0] for f in frames}:
            under[mark] = under.get(mark, 0) + int(count)
        total += int(count)
    print(f"\n{total} samples; by own time:")
    for frame, count in sorted(own.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {count / total:6.1%}  {frame}")
    print("\ninclusive:")
    for frame, count in sorted(under.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {count / total:6.1%}  {frame}")
    out.unlink(missing_ok=True)


def attempt_path(url: str) -> str:
    httpx.post(f"{url}/api/v1/rollouts", json={"task": {"input": "bench"}}).raise_for_status()
    (claimed,) = httpx.post(f"{url}/api/v1/claims", json={"worker_id": "bench", "lease_s": 3600}).json()
    return f"rollout/{claimed['rollout']['id']}/attempt/{claimed['attempt']['id']}"


def main(concurrencies: tuple[int, ...] = CONCURRENCIES, n: int = 2000, rounds: int = 2) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    with (
        upstream_and_server(delay_s=0.02, delay_jitter=0.5) as (upstream_url, server),
        bare_proxy_process(upstream_url) as (bare_url, bare_pid),
    ):
        proxy_url = f"{server.url}/{attempt_path(server.url)}/v1/chat/completions"
        assert server.proc is not None
        for concurrency in concurrencies:
            calls = max(n, 4 * concurrency)
            result = asyncio.run(
                one_concurrency(
                    (f"{bare_url}/chat/completions", bare_pid), proxy_url, server.proc.pid, concurrency, calls, rounds
                )
            )
            rows.update({f"c={concurrency}: {k}": v for k, v in result.items()})
            print(f"c={concurrency}: " + ", ".join(f"{k} {v:,.2f}" for k, v in result.items()), flush=True)
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
    if args.profile:
        profile_at(args.profile, max(args.calls, 4 * args.profile), args.rounds)
    else:
        main(tuple(args.concurrency or CONCURRENCIES), n=args.calls, rounds=args.rounds)
