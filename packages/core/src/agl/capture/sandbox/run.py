"""What evaluators call to run a program the model wrote (its tests, its repaired file): `run_sandboxed`, like
`subprocess.run`, and `sandboxed`, a sandboxed `subprocess.Popen` for those that read its output as it comes.

Same sandbox as `agl.run_cli`'s (docs/security.md), with no LLM to reach: the program sees its working folder
(writable), a private home, the system and its own interpreter (read-only) and what `sandbox.read_only` names;
no network at all unless `sandbox.network` allows hosts through the egress proxy. `sandbox="none"` runs it bare (a
warning says so once).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agl.capture.sandbox.kinds import launch_class
from agl.capture.sandbox.launch import Launch
from agl.capture.sandbox.policy import Sandbox, as_sandbox, warn_bare_once
from agl.capture.tracing.spans import record_span

_OUTPUT_CAP = 16 * 2**20  # what run_sandboxed keeps of each stream: a program cannot fill the worker's memory


@dataclass
class SandboxedRun:
    returncode: int | None  # None: ended by its time limit, a sandbox limit or a signal
    timed_out: bool
    stdout: bytes
    stderr: bytes
    seconds: float
    breaches: list[str] = field(default_factory=list)  # each sandbox limit it breached, said in words
    left_behind: int = 0  # processes still running when it ended (killed with the sandbox)


def run_sandboxed(
    argv: Sequence[str],
    *,
    cwd: str | os.PathLike[str],
    timeout_s: float = 600.0,
    sandbox: Sandbox | str | None = None,
    env: Mapping[str, str] | None = None,
    input: bytes | None = None,
) -> SandboxedRun:
    """Run `argv` in `cwd` in a sandbox and wait for it, at most `timeout_s`; its output is kept (each stream up to
    16 MiB). Never raises for the program's own failure; raises `SandboxUnavailable` where the sandbox cannot start."""
    started, started_at = time.monotonic(), time.time()
    timed_out = False
    with contextlib.ExitStack() as stack:
        handle = stack.enter_context(_Handle.open(argv, cwd=cwd, sandbox=sandbox, env=env))
        files = [stack.enter_context(tempfile.TemporaryFile()) for _ in range(3)]
        if input is not None:
            files[0].write(input)
            files[0].seek(0)
        handle.start(stdin=files[0] if input is not None else subprocess.DEVNULL, stdout=files[1], stderr=files[2])
        timed_out = not handle.wait(timeout_s)
        handle.stop()
        stdout, stderr = (_read_capped(f) for f in files[1:])
    if handle.launch is not None and handle.launch.start_error:
        stderr += f"agl: the command did not start: {handle.launch.start_error}\n".encode()
    breaches = handle.breaches()
    handle.record_breaches(started_at)
    if timed_out:
        breaches.append(f"the command's time limit ({timeout_s:g} s) was reached")
    code = None if timed_out else handle.exit_code()
    return SandboxedRun(code, timed_out, stdout, stderr, time.monotonic() - started, breaches, handle.left_behind())


@contextlib.contextmanager
def sandboxed(
    argv: Sequence[str],
    *,
    cwd: str | os.PathLike[str],
    sandbox: Sandbox | str | None = None,
    env: Mapping[str, str] | None = None,
    **popen: Any,
) -> Iterator[subprocess.Popen[bytes]]:
    """A `subprocess.Popen` of `argv` in a sandbox (`popen`: stdin, stdout, stderr as for Popen). Killing its process
    group (`os.killpg(p.pid, signal.SIGKILL)`) or leaving the block ends the sandbox and every process in it."""
    started_at = time.time()
    with _Handle.open(argv, cwd=cwd, sandbox=sandbox, env=env) as handle:
        process = handle.start(**popen)
        try:
            yield process
        finally:
            handle.stop()
    handle.record_breaches(started_at)


class _Handle:
    """A sandbox, or a bare process group where the caller opted out; one interface for both."""

    def __init__(self, argv: Sequence[str], launch: Launch | None, cwd: str, env: Mapping[str, str] | None) -> None:
        self.argv = list(argv)
        self.launch = launch
        self.cwd = cwd
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None

    @classmethod
    @contextlib.contextmanager
    def open(
        cls,
        argv: Sequence[str],
        *,
        cwd: str | os.PathLike[str],
        sandbox: Sandbox | str | None,
        env: Mapping[str, str] | None,
    ) -> Iterator[_Handle]:
        box = as_sandbox(sandbox)
        folder = os.path.abspath(cwd)
        if box.bare:
            warn_bare_once("agl.run_sandboxed")
            handle = cls(argv, None, folder, env)
            try:
                yield handle
            finally:
                handle.stop()
            return
        home = tempfile.mkdtemp(prefix="agl-sandbox-home-")
        try:
            with launch_class(box)(argv, sandbox=box, cwd=folder, home=home, env=env) as launch:
                yield cls(argv, launch, folder, env)
        finally:
            shutil.rmtree(home, ignore_errors=True)

    def start(self, **popen: Any) -> subprocess.Popen[bytes]:
        if self.launch is not None:
            self.process = self.launch.popen(**popen)
        else:
            environment = {**os.environ, **(self.env or {})}
            environment.pop("AGL_TOKEN", None)
            self.process = subprocess.Popen(self.argv, cwd=self.cwd, env=environment, start_new_session=True, **popen)
        return self.process

    def wait(self, timeout_s: float) -> bool:
        if self.launch is not None:
            return self.launch.wait(timeout_s)
        assert self.process is not None
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop(self) -> None:
        if self.launch is not None:
            self.launch.stop()
            return
        process = self.process
        if process is not None and process.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def exit_code(self) -> int | None:
        if self.launch is not None:
            return self.launch.exit_code()
        code = self.process.returncode if self.process is not None else None
        return None if code is None or code < 0 else code

    def breaches(self) -> list[str]:
        return [b.describe() for b in self.launch.breaches] if self.launch is not None else []

    def record_breaches(self, started_at: float) -> None:
        """Each limit it breached, as a span `sandbox.limit:<limit>` in the rollout (none outside one)."""
        if self.launch is None:
            return
        for breach in self.launch.breaches:
            record_span(
                f"sandbox.limit:{breach.limit}",
                kind="sandbox",
                start_time=started_at,
                status="error",
                status_message=breach.describe(),
                attributes={"sandbox.limit": breach.limit, "sandbox.program": os.path.basename(self.argv[0])},
            )

    def left_behind(self) -> int:
        return self.launch.left_behind if self.launch is not None else 0


def _read_capped(f: Any) -> bytes:
    f.seek(0)
    return bytes(f.read(_OUTPUT_CAP))
