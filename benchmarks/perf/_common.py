"""Shared helpers of the performance benchmarks: process start-up, a process's CPU time, percentiles, result lines."""

from __future__ import annotations

import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from agl.common.processes import ServerProcess, read_ready_line, start_server

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


# `agl serve` started with an optional open-file limit (`serve(fd_limit=...)`), from `--src` sources if given
_SERVE = (
    "import resource, sys\n"
    "limit = int(sys.argv[1])\n"
    "if limit: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))\n"
    "from agl.cli.main import main\n"
    "sys.argv = ['agl', 'serve', *sys.argv[2:]]\n"
    "main()\n"
)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def cpu_clock(pid: int) -> Callable[[], float]:
    """A function giving process `pid`'s CPU seconds so far (user + system, every thread, exited ones included):
    the kernel's CPU clock of that process (ns resolution) where it can be read, else /proc/<pid>/stat (ticks of
    10 ms, too coarse for a call of a few ms)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        clock = ctypes.c_int()
        if libc.clock_getcpuclockid(pid, ctypes.byref(clock)) == 0:
            ts = _Timespec()

            def read() -> float:
                if libc.clock_gettime(clock, ctypes.byref(ts)) != 0:
                    raise OSError(ctypes.get_errno(), f"clock_gettime of process {pid}'s CPU clock")
                return float(ts.tv_sec + ts.tv_nsec / 1e9)

            read()
            return read
    except (OSError, AttributeError):
        pass
    tick = os.sysconf("SC_CLK_TCK")

    def from_proc() -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick

    return from_proc


def status_mb(pid: int, key: str = "VmRSS:") -> float:
    """A memory figure of process `pid` from /proc/PID/status (`VmRSS:` now, `VmHWM:` its peak), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) / 1024
    return float("nan")


class Server:
    """An `agl serve` process started by `serve()`: its URL, address, CPU time and peak RSS."""

    def __init__(self, proc: subprocess.Popen[str], url: str) -> None:
        self.proc, self.url = proc, url
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.addr = (host, int(port))
        self.cpu_s = cpu_clock(proc.pid)  # the server process's CPU seconds so far (user + system)

    def peak_rss_mb(self) -> float:
        return status_mb(self.proc.pid, "VmHWM:")


@contextmanager
def serve(
    src: str | None = None, *, fd_limit: int = 0, upstream: str | None = None, extra: tuple[str, ...] = ()
) -> Iterator[Server]:
    """`agl serve` in a process of its own on a temporary run directory (from the sources `src` if given), with
    the options `extra` besides."""
    env = {**os.environ}
    if src:
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    with tempfile.TemporaryDirectory(prefix="agl-attack-") as tmp:
        args = [f"--run-dir={tmp}/run", "--port=0", "--log-level=error"]
        if upstream:
            args.append(f"--upstream={upstream}")
        args.extend(extra)
        proc = subprocess.Popen(
            [sys.executable, "-c", _SERVE, str(fd_limit), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        try:
            yield Server(proc, read_ready_line(proc, "AGL_SERVER_READY", 60))
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


@contextmanager
def scripted_upstream(**options: Any) -> Iterator[str]:
    """The scripted upstream (`agl.testing.upstream`) in a process of its own; yields its `/v1` base URL."""
    from agl.testing.upstream import start_upstream_process

    proc, url = start_upstream_process(**options)
    try:
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def claim_attempt(server_url: str) -> str:
    """Make a rollout and claim it: the `/v1` base URL of its attempt, through the server's proxy."""
    httpx.post(f"{server_url}/api/v1/rollouts", json={"task": {"input": "q"}}).raise_for_status()
    (c,) = httpx.post(f"{server_url}/api/v1/claims", json={"worker_id": "w", "lease_s": 3600}).json()
    return f"{server_url}/rollout/{c['rollout']['id']}/attempt/{c['attempt']['id']}/v1"


def long_answer_body(tokens: int) -> dict[str, Any]:
    """A streamed chat request the scripted upstream answers with ~`tokens` tokens, one SSE event each (with ids and
    log-probs, as vLLM sends them). It echoes the prompt: "hi " n times is 2n pieces (words and spaces), so the
    prompt is as long as the answer."""
    return {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi " * (tokens // 2)}]}


def stream_answer(url: str, body: dict[str, Any], timeout: float = 600) -> int:
    """POST a streamed chat completion to `url` and read the answer whole; the bytes received."""
    received = 0
    with httpx.stream("POST", url, json=body, timeout=timeout) as resp:
        resp.raise_for_status()
        for data in resp.iter_bytes():
            received += len(data)
    return received


class Probe:
    """Polls GET /api/v1/info from a thread: the slowest answer and how many failed."""

    def __init__(self, url: str, guard: Server | None = None, max_rss_mb: float = 6000) -> None:
        self.url = f"{url}/api/v1/info"
        # the server `guard` is killed once its RSS passes `max_rss_mb` (this machine has 24 GB, shared)
        self.guard, self.max_rss_mb = guard, max_rss_mb
        self.killed_at_mb: float | None = None
        self.worst_s = 0.0
        self.failed = 0
        self.answered = 0
        self.latencies: list[float] = []
        self.failures: Counter[str] = Counter()  # by status code, or by the exception that ended the request
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        # one client, so that a poll does not pay for building one (httpx loads the TLS certificate store: ~27 ms
        # a poll here, which the figures before 2026-11-27 include), and a new connection each poll, as before
        with httpx.Client(timeout=30, headers={"connection": "close"}) as client:
            self._poll(client)

    def _poll(self, client: httpx.Client) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                status = client.get(self.url).status_code
                ok, failure = status == 200, str(status)
            except httpx.HTTPError as exc:
                ok, failure = False, type(exc).__name__
            elapsed = time.monotonic() - t0
            self.worst_s = max(self.worst_s, elapsed)
            self.latencies.append(elapsed)
            self.answered += ok
            self.failed += not ok
            if not ok:
                self.failures[failure] += 1
            self._stop.wait(0.05)

    def rows(self) -> dict[str, Any]:
        """The health figures of the new attacks: polls, failures by kind, 99th percentile and slowest (and the
        RSS at which the server was killed, if it was)."""
        killed = {} if self.killed_at_mb is None else {"SERVER KILLED at RSS (MB)": self.killed_at_mb}
        return {
            **killed,
            "health: polls": len(self.latencies),
            "health: failed (by status or error)": f"{self.failed} {dict(self.failures)}" if self.failed else 0,
            "health: p99 (s)": percentile(self.latencies, 0.99),
            "health: slowest (s)": self.worst_s,
        }

    def _watch(self, server: Server) -> None:
        status = Path(f"/proc/{server.proc.pid}/status")
        while not self._stop.wait(0.05):
            try:
                rss = next(int(line.split()[1]) / 1024 for line in status.open() if line.startswith("VmRSS:"))
            except (OSError, StopIteration):
                return
            if rss > self.max_rss_mb:
                self.killed_at_mb = rss
                server.proc.kill()
                return

    def __enter__(self) -> Probe:
        self._thread.start()
        if self.guard is not None:
            threading.Thread(target=self._watch, args=(self.guard,), daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)
