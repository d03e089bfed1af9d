"""Kernel-enforced limits for a sandbox's whole process tree, where agl may create a cgroup (run as root, or with a
delegated cgroup v2 subtree): `pids.max` and a memory limit, counted over every process and thread, tmpfs pages
included. Where it may not, the sandbox's first process enforces the same limits by watching (supervisor.py) and
`RLIMIT_NPROC` bounds the processes in its user namespace (not for root: the kernel exempts uid 0 from it, which is
why a cgroup matters most there).

Both cgroup versions: v1 (a hierarchy per controller, `/sys/fs/cgroup/pids`, `/sys/fs/cgroup/memory`) and v2 (one
unified hierarchy). The cgroup is made below the worker's own, so a limit the worker runs under still applies.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
THREAD_MARGIN = 32  # the sandbox's first process and its relay threads count in pids.max too


class Cgroup:
    """One sandbox's cgroup(s): made with `create`, joined by the child in `join`, read by `breaches`, gone in
    `remove`."""

    def __init__(self, folders: dict[str, Path], version: int) -> None:
        self.folders = folders  # controller ("pids", "memory") -> its folder; one folder for both on v2
        self.version = version

    @classmethod
    def create(cls, *, processes: int, memory_mb: int) -> Cgroup | None:
        """A new cgroup with both limits, or None where this process may not make one."""
        name = f"agl-sandbox-{uuid.uuid4().hex[:12]}"
        own = _own_cgroups()
        if (ROOT / "cgroup.controllers").is_file():  # v2
            parent = ROOT / own.get("", "/").lstrip("/")
            if not {"pids", "memory"} <= set(_read(parent / "cgroup.subtree_control").split()):
                return None
            folders = {"pids": parent / name, "memory": parent / name}
            version = 2
        else:
            folders = {c: ROOT / c / own.get(c, "/").lstrip("/") / name for c in ("pids", "memory")}
            version = 1
        made: list[Path] = []
        try:
            for folder in dict.fromkeys(folders.values()):
                folder.mkdir()
                made.append(folder)
            limit = str(memory_mb * 2**20)
            if version == 2:
                _write(folders["pids"] / "pids.max", str(processes + THREAD_MARGIN))
                _write(folders["memory"] / "memory.max", limit)
                _write(folders["memory"] / "memory.swap.max", "0", missing_ok=True)
            else:
                _write(folders["pids"] / "pids.max", str(processes + THREAD_MARGIN))
                _write(folders["memory"] / "memory.limit_in_bytes", limit)
                _write(folders["memory"] / "memory.memsw.limit_in_bytes", limit, missing_ok=True)
        except OSError:
            for folder in made:
                with contextlib.suppress(OSError):
                    folder.rmdir()
            return None
        return cls(folders, version)

    def join_command(self) -> str:
        """A shell command that moves the shell running it in (before it execs bwrap: a `preexec_fn` would make
        Python fork the whole worker instead of spawning, several ms per sandbox)."""
        return " && ".join(f"echo $$ > '{folder}/cgroup.procs'" for folder in dict.fromkeys(self.folders.values()))

    def breaches(self) -> list[str]:
        """The limits that refused or killed something: `processes`, `memory_mb`."""
        found = []
        if _events(self.folders["pids"] / "pids.events").get("max", 0) > 0:
            found.append("processes")
        memory = self.folders["memory"]
        # only a kill counts: reaching the limit alone may just have reclaimed page cache
        events = memory / ("memory.events" if self.version == 2 else "memory.oom_control")
        if _events(events).get("oom_kill", 0) > 0:
            found.append("memory_mb")
        return found

    def remove(self) -> None:
        """Kill anything still in it, then delete it."""
        for folder in dict.fromkeys(self.folders.values()):
            for _ in range(50):
                pids = [int(p) for p in _read(folder / "cgroup.procs").split()]
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.02)
            with contextlib.suppress(OSError):
                folder.rmdir()


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup per controller (v1: "pids" -> path; v2: "" -> path), from /proc/self/cgroup."""
    found: dict[str, str] = {}
    for line in _read(Path("/proc/self/cgroup")).splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            found[controller] = path
    return found


def _events(path: Path) -> dict[str, int]:
    found = {}
    for line in _read(path).splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            found[key] = int(value)
    return found


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _write(path: Path, value: str, *, missing_ok: bool = False) -> None:
    try:
        path.write_text(value)
    except FileNotFoundError:
        if not missing_ok:
            raise
