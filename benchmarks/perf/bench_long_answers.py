"""Long streamed answers through `agl serve`'s proxy: whether the server's cost per token stays flat as answers grow,
and whether `/healthz` stays quick while one streams.

A real `agl serve` process forwards to the scripted upstream (`agl.testing.upstream`, its own process), which
streams each answer as vLLM does: one SSE event a token, with its id and log-prob. The agent side (this process)
makes a rollout, claims it and POSTs a streamed chat completion to `/rollout/{rid}/attempt/{aid}/v1/chat/completions`,
reading the stream whole. The scripted upstream echoes the prompt, so a request for N tokens also carries a prompt
of N tokens (its ids come back in the first event and are stored too).

For each answer size (full run: 1k, 8k, 32k and 128k tokens):

- **CPU per answer**: the `agl serve` process's CPU time (every thread; the kernel's per-process CPU clock, ns
  resolution) from just before the request until the answer has been read and the server has gone quiet again
  (`--settle-s` after the end: the writer may still be storing the call), less what the idle server spent over
  the same time (measured before the answers, over `--idle-s`). Sizes are repeated until each has streamed
  `--min-tokens` tokens, at least twice, with no health polls; the median answer is kept. CPU per token is that
  divided by the tokens the answer held.
- **Health latency while streaming**: as many answers again
  while another process polls `GET /healthz` over a keep-alive connection, one poll after another with
  `--health-gap-ms` between them; only polls that overlap a stream count. p50, p99 and max.

Targets: the server's CPU per token within 2× from the smallest answer to the largest (max/min over the sizes),
and health p99 < 50 ms during every size. `--check` exits 1 when a target is missed.

    python benchmarks/perf/bench_long_answers.py                   # 1k, 8k, 32k, 128k
    python benchmarks/perf/bench_long_answers.py --sizes 1000 16000 --check
    python benchmarks/perf/bench_long_answers.py --src OLD/packages/core/src --name before
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from _common import (
    Server,
    claim_attempt,
    long_answer_body,
    median,
    percentile,
    report,
    scripted_upstream,
    serve,
    stream_answer,
)

SIZES = (1_000, 8_000, 32_000, 128_000)
SMOKE_SIZES = (1_000, 16_000)
TARGET_CPU_RATIO = 2.0  # max/min of the server's CPU per token over the sizes
TARGET_HEALTH_P99_MS = 50.0

# Polls /healthz from its own process (so the agent's reading of the stream cannot delay it) until its stdin
# closes; then prints [[start (CLOCK_MONOTONIC, shared by every process), seconds, status], ...] as JSON.
_POLLER = r"""
import http.client, json, sys, threading, time
host, port, gap = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
polls = []
conn = http.client.HTTPConnection(host, port, timeout=60)
while not stop.is_set():
    t0 = time.monotonic()
    try:
        conn.request("GET", "/healthz")
        resp = conn.getresponse()
        resp.read()
        status = resp.status
    except (OSError, http.client.HTTPException):
        conn.close()
        conn = http.client.HTTPConnection(host, port, timeout=60)
        status = 0
    polls.append((t0, time.monotonic() - t0, status))
    if len(polls) == 1:
        print("polling", flush=True)
    if gap:
        stop.wait(gap)
print(json.dumps(polls), flush=True)
"""


class HealthPoller:
    """`GET /healthz`, one poll after another, from a process of its own while the `with` block runs."""

    def __init__(self, addr: tuple[str, int], gap_s: float) -> None:
        self.args = [sys.executable, "-c", _POLLER, addr[0], str(addr[1]), str(gap_s)]
        self.polls: list[tuple[float, float, int]] = []

    def __enter__(self) -> HealthPoller:
        self.proc = subprocess.Popen(self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "polling":
            raise RuntimeError("the health poller did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        out, _ = self.proc.communicate(input="", timeout=120)
        self.polls = [tuple(p) for p in json.loads(out)]

    def during(self, spans: list[tuple[float, float]]) -> list[tuple[float, float, int]]:
        """The polls that overlap one of `spans` (start, end)."""
        return [p for p in self.polls if any(p[0] < end and p[0] + p[1] > start for start, end in spans)]


def idle_cpu_rate(cpu_s: Callable[[], float], seconds: float) -> float:
    """The server's CPU seconds per second while nothing asks it anything (its lease sweep, its timers)."""
    cpu0, t0 = cpu_s(), time.monotonic()
    time.sleep(seconds)
    return (cpu_s() - cpu0) / (time.monotonic() - t0)


def one_answer(server: Server, tokens: int, idle_rate: float, settle_s: float) -> dict[str, float]:
    """Stream one answer of ~`tokens` tokens through the proxy on a fresh attempt: its wall time, the server CPU it
    cost (idle rate subtracted), and the bytes the agent received."""
    url = f"{claim_attempt(server.url)}/chat/completions"
    body = long_answer_body(tokens)
    cpu0, t0 = server.cpu_s(), time.monotonic()
    received = stream_answer(url, body)
    t1 = time.monotonic()
    time.sleep(settle_s)
    cpu, t2 = server.cpu_s() - cpu0, time.monotonic()
    return {"start": t0, "end": t1, "seconds": t1 - t0, "cpu_s": cpu - idle_rate * (t2 - t0), "bytes": received}


def answer_tokens(tokens: int) -> int:
    """The tokens the scripted upstream's answer to `long_answer_body(tokens)` holds ("Echo: " + the prompt)."""
    from agl.testing.upstream import pieces

    return len(pieces("Echo: " + long_answer_body(tokens)["messages"][0]["content"]))


def run(
    sizes: tuple[int, ...],
    *,
    src: str | None = None,
    min_tokens: int = 64_000,
    idle_s: float = 2.0,
    settle_s: float = 0.2,
    health_gap_ms: float = 1.0,
    name: str = "long_answers",
) -> dict[str, Any]:
    rows: dict[str, Any] = {"sizes (tokens asked)": list(sizes)}
    per_token: dict[int, float] = {}
    health_p99: dict[int, float] = {}
    table: list[tuple[int, int, int, float, float, float, float, float, float, int]] = []
    t_start = time.monotonic()
    with scripted_upstream() as upstream, serve(src, upstream=upstream) as server:
        one_answer(server, 2_000, 0.0, 0.0)  # warm-up: the proxy's upstream pool, its code paths
        idle = idle_cpu_rate(server.cpu_s, idle_s)
        rows["server CPU when idle (ms/s, subtracted)"] = idle * 1e3
        for tokens in sizes:
            n_tok = answer_tokens(tokens)
            repeats = max(2, -(-min_tokens // n_tok))
            t_size = time.monotonic()
            quiet = [one_answer(server, tokens, idle, settle_s) for _ in range(repeats)]
            cpu = median([a["cpu_s"] for a in quiet])
            per_token[tokens] = cpu / n_tok
            with HealthPoller(server.addr, health_gap_ms / 1e3) as poller:
                polled = [one_answer(server, tokens, idle, settle_s) for _ in range(repeats)]
            during = poller.during([(a["start"], a["end"]) for a in polled])
            lat_ms = [p[1] * 1e3 for p in during]
            failed = sum(1 for p in during if p[2] != 200)
            health_p99[tokens] = percentile(lat_ms, 0.99)
            secs = median([a["seconds"] for a in quiet])
            label = f"{tokens // 1000}k"
            rows[f"{label}: tokens in the answer"] = n_tok
            rows[f"{label}: answers measured (quiet / with health polls)"] = f"{repeats} / {len(polled)}"
            rows[f"{label}: MB streamed to the agent"] = quiet[0]["bytes"] / 2**20
            rows[f"{label}: seconds per answer (median, quiet)"] = secs
            rows[f"{label}: server CPU s per answer (median, quiet)"] = cpu
            rows[f"{label}: server CPU µs per token"] = per_token[tokens] * 1e6
            rows[f"{label}: server CPU s per answer with health polls (median)"] = median([a["cpu_s"] for a in polled])
            rows[f"{label}: health polls during the stream"] = len(lat_ms)
            rows[f"{label}: health failed (not 200)"] = failed
            rows[f"{label}: health p50 ms"] = percentile(lat_ms, 0.5)
            rows[f"{label}: health p99 ms"] = health_p99[tokens]
            rows[f"{label}: health max ms"] = max(lat_ms, default=float("nan"))
            rows[f"{label}: wall seconds for this size (all its answers)"] = time.monotonic() - t_size
            table.append(
                (
                    tokens,
                    n_tok,
                    repeats,
                    secs,
                    cpu,
                    per_token[tokens] * 1e6,
                    percentile(lat_ms, 0.5),
                    health_p99[tokens],
                    max(lat_ms, default=float("nan")),
                    len(lat_ms),
                )
            )
    smallest, largest = min(sizes), max(sizes)
    ratio = max(per_token.values()) / min(per_token.values())
    rows[f"CPU per token: {largest // 1000}k / {smallest // 1000}k"] = per_token[largest] / per_token[smallest]
    rows["CPU per token: max / min over the sizes"] = ratio
    rows["health p99 ms: worst size"] = max(health_p99.values())
    rows["wall seconds, whole run"] = time.monotonic() - t_start
    cpu_ok = ratio <= TARGET_CPU_RATIO
    health_ok = all(v < TARGET_HEALTH_P99_MS for v in health_p99.values())  # nan (no poll) fails
    rows["target: CPU per token max / min ≤"] = TARGET_CPU_RATIO
    rows["target: health p99 ms <"] = TARGET_HEALTH_P99_MS
    rows["meets CPU target"] = cpu_ok
    rows["meets health target"] = health_ok
    rows["meets target"] = cpu_ok and health_ok

    print(f"\n{'tokens':>8} {'in answer':>9} {'runs':>4} {'s/answer':>9} {'CPU s':>8} {'CPU µs/tok':>10} "
          f"{'health p50':>10} {'p99':>8} {'max ms':>8} {'polls':>6}")  # fmt: skip
    for tokens, n_tok, reps, secs, cpu, us, p50, p99, worst, polls in table:
        print(
            f"{tokens:>8,} {n_tok:>9,} {reps:>4} {secs:>9.3f} {cpu:>8.3f} {us:>10.2f} "
            f"{p50:>10.2f} {p99:>8.2f} {worst:>8.2f} {polls:>6}"
        )
    print(f"CPU per token, max / min over the sizes: {ratio:.2f} (target ≤ {TARGET_CPU_RATIO:g}): "
          f"{'PASS' if cpu_ok else 'FAIL'}")  # fmt: skip
    print(f"health p99 during the stream, worst size: {rows['health p99 ms: worst size']:.1f} ms "
          f"(target < {TARGET_HEALTH_P99_MS:g} ms): {'PASS' if health_ok else 'FAIL'}")  # fmt: skip
    report(name, rows)
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="answer lengths in tokens")
    parser.add_argument("--min-tokens", type=int, default=64_000, help="repeat each size until this many streamed")
    parser.add_argument("--idle-s", type=float, default=2.0, help="how long to measure the idle server's CPU")
    parser.add_argument("--settle-s", type=float, default=0.2, help="CPU still counted after an answer's end")
    parser.add_argument("--health-gap-ms", type=float, default=1.0, help="pause between two health polls")
    parser.add_argument("--src", help="agl-core sources to run the server from (default: the installed agl)")
    parser.add_argument("--name", default="long_answers", help="name of the result file")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    rows = run(
        tuple(args.sizes),
        src=args.src,
        min_tokens=args.min_tokens,
        idle_s=args.idle_s,
        settle_s=args.settle_s,
        health_gap_ms=args.health_gap_ms,
        name=args.name,
    )
    if args.check and not rows["meets target"]:
        sys.exit(1)
    return rows


def smoke() -> None:
    """`make bench-smoke`: that this script runs, at a small size (the numbers are not judged)."""
    run(SMOKE_SIZES, min_tokens=16_000, idle_s=0.5, name="long_answers_smoke")


if __name__ == "__main__":
    main()
