"""Start real `agl serve` and `agl worker` processes and wait until they are ready (trainer, tests, demos)."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any


def stop_processes(procs: Iterable[subprocess.Popen[Any] | None], grace_s: float = 15.0) -> None:
    """Stop processes together: SIGTERM to every one still running, then wait for all of them at most `grace_s`
    in total (they shut down side by side, not one after another), then SIGKILL any left and reap it."""
    running = [p for p in procs if p is not None and p.poll() is None]
    for proc in running:
        proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in running:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def read_ready_line(proc: subprocess.Popen[str], marker: str, timeout: float) -> str:
    """Wait for `marker <url>` on the process's stdout; keep draining stdout afterwards."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump(stream: IO[str]) -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, args=(proc.stdout,), daemon=True).start()
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.1)
        except queue.Empty:
            continue
        if line is None:
            break
        seen.append(line)
        if line.startswith(marker):
            return line.split()[1]
    proc.kill()
    stderr = proc.stderr.read() if proc.stderr else ""
    raise RuntimeError(
        f"process did not print {marker} within {timeout} s; stdout={''.join(seen)!r} stderr={stderr[-2000:]!r}"
    )


@dataclass
class ServerProcess:
    """A running `agl serve`; `restart()` starts it again on the same run directory and port."""

    run_dir: Path
    args: list[str]
    env: dict[str, str]
    proc: subprocess.Popen[str] | None = None
    url: str = ""
    port: int = 0
    log_path: Path = field(init=False)

    def start(self, timeout: float = 60.0) -> ServerProcess:
        self.log_path = self.run_dir / "server.log"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("a")
        args = [*self.args]
        if self.port:
            args = [a if a != "--port=0" else f"--port={self.port}" for a in args]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agl.cli.main", "serve", *args],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=self.env,
        )
        self.url = read_ready_line(self.proc, "AGL_SERVER_READY", timeout)
        self.port = int(self.url.rsplit(":", 1)[1])
        return self

    def kill(self) -> None:
        """SIGKILL: the crash case."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        stop_processes([self.proc])

    def restart(self, timeout: float = 60.0) -> ServerProcess:
        self.stop()
        return self.start(timeout)


def start_server(
    run_dir: str | Path,
    *,
    upstream: str | None = None,
    token: str | None = None,
    host: str = "127.0.0.1",
    extra_args: list[str] | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> ServerProcess:
    args = [f"--run-dir={run_dir}", f"--host={host}", "--port=0", "--log-level=warning"]
    if upstream:
        args.append(f"--upstream={upstream}")
    if token:
        args.append(f"--token={token}")
    args += extra_args or []
    full_env = {**os.environ, **(env or {})}
    full_env.pop("AGL_TOKEN", None)
    return ServerProcess(Path(run_dir), args, full_env).start(timeout)


def start_worker(
    agent: str,
    server_url: str,
    *,
    concurrency: int = 4,
    extra_args: list[str] | None = None,
    env: dict[str, str] | None = None,
    log_path: str | Path | None = None,
    cwd: str | Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start `agl worker AGENT` in a new process (in `cwd`, where the app writes its files); its output goes to
    `log_path` (or is discarded)."""
    out: IO[bytes] | int = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agl.cli.main",
            "worker",
            agent,
            f"--server={server_url}",
            f"--concurrency={concurrency}",
            *(extra_args or []),
        ],
        stdout=out,
        stderr=out,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


def killed_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` that has the kernel SIGKILL the child when the thread that started it ends (Linux's
    `PR_SET_PDEATHSIG`), or None elsewhere: for servers started by a Ray actor, which may die without stopping
    them. libc is loaded here, before the fork: a child between fork and exec must not import or load anything."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig, sigkill = 1, int(signal.SIGKILL)

    def preexec() -> None:
        prctl(pr_set_pdeathsig, sigkill, 0, 0, 0)

    return preexec
