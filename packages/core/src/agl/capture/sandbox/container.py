"""The same sandbox in a container, for a task that needs an image (a SWE-bench instance's, a language's toolchain):
`Sandbox(kind="container", image="...")`, run by podman or docker.

The rules are bubblewrap's (launch.py): no network but the relays (`--network none`; the relays' Unix sockets and the
supervisor bound read-only at /run/agl), the workspace and the home bound at the same paths and the only writable
places (`--read-only` root, a `--tmpfs /tmp` of `tmp_mb`), the limits as the runtime's own (`--pids-limit`,
`--memory`, `--ulimit`s), no capabilities, `no-new-privileges`, the worker's uid. The supervisor runs on the image's
`python3` (standard library only), as PID 1 of the container. Its reports go to a file bound in (a runtime cannot
pass a descriptor through its daemon). A missing runtime, or one that does not answer, is a `SandboxUnavailable`.
"""

from __future__ import annotations

import contextlib
import functools
import marshal
import os
import shlex
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

from agl.capture.sandbox import bwrap
from agl.capture.sandbox.cgroups import THREAD_MARGIN, Cgroup
from agl.capture.sandbox.launch import Launch
from agl.capture.sandbox.policy import Sandbox

RUNTIMES = ("podman", "docker")
MEMORY_MARGIN_MB = 64  # above the supervisor's own watch, so that it reports the breach before the runtime kills


@functools.lru_cache(maxsize=8)
def runtime_for(chosen: str | None) -> tuple[list[str] | None, str]:
    """The runtime's command (`podman`, `docker`, or what `chosen` says, e.g. "podman --runtime runc") and why none
    answers when it is None."""
    candidates = [shlex.split(chosen)] if chosen else [[name] for name in RUNTIMES]
    tried = []
    for command in candidates:
        if shutil.which(command[0]) is None:
            tried.append(f"{command[0]}: not installed")
            continue
        try:
            answer = subprocess.run([*command, "info"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            tried.append(f"{command[0]}: {exc}")
            continue
        if answer.returncode == 0:
            return command, ""
        tried.append(
            f"{command[0]} info: {(answer.stderr.strip().splitlines() or ['exit ' + str(answer.returncode)])[-1]}"
        )
    return None, "; ".join(tried)


class ContainerLaunch(Launch):
    """`Launch` with a container instead of bubblewrap (see the module's docstring)."""

    def unavailable(self, sandbox: Sandbox) -> str | None:
        command, why = runtime_for(sandbox.runtime)
        if command is None:
            return (
                f"no container runtime answers ({why}): install podman or docker and check that `podman info` or "
                "`docker info` works, or use the bubblewrap sandbox (Sandbox(kind='bwrap'))"
            )
        return None

    def _make_cgroup(self) -> Cgroup | None:
        return None  # the runtime makes the container's own

    def container_command(self, env: dict[str, str], status_path: str) -> list[str]:
        """The runtime's command line for this sandbox (run with `popen`; tested as it is)."""
        runtime, _ = runtime_for(self.sandbox.runtime)
        assert runtime is not None
        limits = self.sandbox.limits
        self.name = f"agl-sandbox-{uuid.uuid4().hex[:12]}"
        writable = [self.cwd, *self.sandbox.writable]
        args = [*runtime, "run", "--rm", "--name", self.name, "--network", "none", "--read-only"]
        args += ["--tmpfs", f"/tmp:rw,size={limits.tmp_mb}m,mode=1777", "--tmpfs", "/run:rw,size=1m"]
        args += ["--pids-limit", str(limits.processes + THREAD_MARGIN)]
        args += ["--memory", f"{limits.memory_mb + MEMORY_MARGIN_MB}m"]
        args += ["--memory-swap", f"{limits.memory_mb + MEMORY_MARGIN_MB}m"]
        args += ["--ulimit", f"nofile={limits.open_files}:{limits.open_files}"]
        # set explicitly: a runtime's default process limit may exceed the worker's own, which it may not raise
        args += ["--ulimit", f"nproc={limits.processes + THREAD_MARGIN}:{limits.processes + THREAD_MARGIN}"]
        args += ["--ulimit", f"cpu={limits.cpu_s}:{limits.cpu_s + 1}"]
        args += ["--ulimit", f"fsize={limits.disk_mb * 2**20}:{limits.disk_mb * 2**20}"]
        args += ["--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
        args += ["--user", f"{os.getuid()}:{os.getgid()}", "--hostname", "agl-sandbox"]
        if runtime[0].endswith("podman") and os.getuid() != 0:
            args += ["--userns", "keep-id"]  # rootless podman: the worker's uid inside is the worker's outside
        if "stdin" in self._popen_kwargs:
            args.append("--interactive")
        for path in dict.fromkeys(self.sandbox.read_only):
            args += ["--volume", f"{path}:{path}:ro"]
        for path in dict.fromkeys([self.home, *writable]):
            args += ["--volume", f"{path}:{path}:rw"]
        args += ["--volume", f"{Path(self._state) / 'sock'}:{bwrap.INSIDE_RUN}/sock:ro"]
        args += ["--volume", f"{bwrap.SUPERVISOR}:{bwrap.INSIDE_RUN}/supervisor.py:ro"]
        args += ["--volume", f"{status_path}:{bwrap.INSIDE_RUN}/status:rw"]
        args += ["--workdir", self.cwd]
        for key, value in sorted(env.items()):
            args += ["--env", f"{key}={value}"]
        config = {**self.supervisor_config(writable), "status_path": f"{bwrap.INSIDE_RUN}/status"}
        config.update(argv=self.argv, cwd=self.cwd)
        config["limits"] = {**config["limits"], "kernel_enforced": False}  # type: ignore[dict-item]
        image = self.sandbox.image
        assert image is not None
        return [*args, image, "python3", "-I", "-S", f"{bwrap.INSIDE_RUN}/supervisor.py", marshal.dumps(config).hex()]

    def environment(self) -> dict[str, str]:
        env = super().environment()
        env.pop("PATH", None)  # the image's own
        return env

    def popen(self, **kwargs: Any) -> subprocess.Popen[bytes]:
        self._popen_kwargs = {k: v for k, v in kwargs.items() if v is not None and v is not subprocess.DEVNULL}
        status = Path(self._state) / "status"
        status.touch()
        os.chmod(status, 0o666)  # the worker's uid writes it inside; nobody else sees the folder
        self._status_path = status
        command = self.container_command(self.environment(), str(status))
        self.process = subprocess.Popen(command, start_new_session=True, **kwargs)
        return self.process

    def stop(self, grace_s: float = 2.0) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        self._stopping = True
        runtime, _ = runtime_for(self.sandbox.runtime)
        if runtime is not None:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run([*runtime, "stop", "-t", str(int(grace_s)), self.name], capture_output=True, timeout=60)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(10)
        if process.poll() is None:
            process.kill()
            process.wait()

    def __exit__(self, *exc: object) -> None:
        status = getattr(self, "_status_path", None)
        try:
            self.stop(grace_s=0.0)
            if status is not None:
                with contextlib.suppress(OSError):
                    for line in status.read_text(errors="replace").splitlines():
                        self._status_line(line)
        finally:
            super().__exit__(*exc)
