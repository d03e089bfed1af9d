"""Shared helpers of the performance benchmarks: process start-up, percentiles, result lines."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agl.common.processes import ServerProcess, start_server

RESULTS_DIR = Path(os.environ.get("AGL_BENCH_OUT", Path(__file__).resolve().parent / "results"))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


@contextmanager
def upstream_and_server(**upstream_options: Any) -> Iterator[tuple[str, ServerProcess]]:
    """A scripted upstream process and an `agl serve` process forwarding to it, in a temporary run directory."""
    from agl.testing.upstream import start_upstream_process

    proc, upstream_url = start_upstream_process(**upstream_options)
    try:
        with tempfile.TemporaryDirectory(prefix="agl-bench-") as tmp:
            server = start_server(Path(tmp) / "run", upstream=upstream_url)
            try:
                yield upstream_url, server
            finally:
                server.stop()
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def report(name: str, rows: dict[str, Any]) -> None:
    """Print one benchmark's figures and keep them as JSON next to the scripts."""
    print(f"\n== {name}")
    for key, value in rows.items():
        shown = f"{value:,.3f}" if isinstance(value, float) else str(value)
        print(f"  {key:<62} {shown}")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / f"{name}.json").write_text(json.dumps(rows, indent=2) + "\n")
