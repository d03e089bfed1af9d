"""What a sandbox allows: `Sandbox` (which mechanism, what is visible, where the network goes) and `Limits`.

The defaults are the safe ones: bubblewrap, nothing visible but the system (read-only), the command's own program
files (read-only) and its workspace and private home (writable), no network but the attempt's LLM routes, every
other host refused. A task widens them by name (`read_only`, `writable`, `network`); `Sandbox(kind="none")` (or
`sandbox="none"`) opts out entirely, with a warning.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, replace
from typing import Literal

SandboxKind = Literal["bwrap", "container", "none"]
NetworkMode = Literal["refuse", "record", "allow"]
log = logging.getLogger("agl.sandbox")
_warned_bare = False


@dataclass(frozen=True)
class Limits:
    """What one sandboxed command may use, all its processes together unless said otherwise. A breach ends the
    command (or, for `open_files`, refuses the next open) and is recorded in the rollout as a span naming the limit.

    - `memory_mb`: resident memory of the whole process tree (a cgroup's limit where agl may create one, else
      checked every 50 ms by the sandbox's first process);
    - `processes`: processes and threads alive at once (a cgroup's `pids.max`, else `RLIMIT_NPROC` in the sandbox's
      user namespace, and checked every 50 ms);
    - `cpu_s`: CPU seconds of each process (`RLIMIT_CPU`; the wall-clock limit is the command's `timeout_s`);
    - `open_files`: descriptors of each process (`RLIMIT_NOFILE`);
    - `disk_mb`: bytes written to the writable folders together (checked every 0.5 s), and the largest file
      (`RLIMIT_FSIZE`);
    - `tmp_mb`: the private `/tmp` (in memory, a tmpfs of that size)."""

    memory_mb: int = 4096
    processes: int = 512
    cpu_s: int = 3600
    open_files: int = 4096
    disk_mb: int = 4096
    tmp_mb: int = 512

    def __post_init__(self) -> None:
        for name in ("memory_mb", "processes", "cpu_s", "open_files", "disk_mb", "tmp_mb"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"agl sandbox limit {name} must be a whole number >= 1, not {value!r}")


@dataclass(frozen=True)
class Sandbox:
    """How a command-line agent or a program an evaluator runs is confined (see docs/security.md).

    - `kind`: `"bwrap"` (bubblewrap: namespaces on the worker's machine, the default), `"container"` (podman or
      docker, in `image`), `"none"` (no confinement: the command runs with everything the worker's user has);
    - `read_only`: more paths it may read (a task's data), at the same path inside;
    - `writable`: more paths it may write, at the same path inside (its workspace and home always are);
    - `network`: hosts other than agl, through the egress proxy: `"refuse"` (the default), `"record"` (counted,
      forwarded), `"allow"` (forwarded, not counted). Connections that ignore the proxy reach nothing: the sandbox
      has a network of its own with no route out;
    - `limits`: see `Limits`;
    - `image`, `runtime`: for `kind="container"`, the image and the program (`podman` or `docker`; default: the first
      that answers)."""

    kind: SandboxKind = "bwrap"
    read_only: tuple[str, ...] = ()
    writable: tuple[str, ...] = ()
    network: NetworkMode = "refuse"
    limits: Limits = field(default_factory=Limits)
    image: str | None = None
    runtime: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("bwrap", "container", "none"):
            raise ValueError(f"agl sandbox kind must be 'bwrap', 'container' or 'none', not {self.kind!r}")
        if self.network not in ("refuse", "record", "allow"):
            raise ValueError(f"agl sandbox network must be 'refuse', 'record' or 'allow', not {self.network!r}")
        if self.kind == "container" and not self.image:
            raise ValueError("agl sandbox kind 'container' needs an image: Sandbox(kind='container', image='...')")
        for name in ("read_only", "writable"):
            paths = getattr(self, name)
            if isinstance(paths, (str, os.PathLike)):
                raise ValueError(f"agl sandbox {name} is a list of paths, not one path: ({str(paths)!r},)")
            object.__setattr__(self, name, tuple(os.path.abspath(os.fspath(p)) for p in paths))

    @property
    def bare(self) -> bool:
        return self.kind == "none"

    def with_limits(self, **changes: int | None) -> Sandbox:
        """This sandbox with the given limits changed (None: left as it is)."""
        given = {k: v for k, v in changes.items() if v is not None}
        return replace(self, limits=replace(self.limits, **given)) if given else self


def as_sandbox(value: Sandbox | str | None) -> Sandbox:
    """`None` → the default sandbox; `"bwrap"`, `"none"` → that kind; a `Sandbox` as it is."""
    if value is None:
        return Sandbox()
    if isinstance(value, Sandbox):
        return value
    if value in ("bwrap", "none"):
        return Sandbox(kind=value)  # type: ignore[arg-type]
    if value == "container":
        raise ValueError("sandbox='container' needs an image: pass Sandbox(kind='container', image='...')")
    raise ValueError(f"sandbox must be 'bwrap', 'none', a Sandbox(...) or None (the default), not {value!r}")


def warn_bare_once(what: str) -> None:
    """The opt-out is a choice, said once per process: everything the command does, the worker's user may do."""
    global _warned_bare
    if not _warned_bare:
        _warned_bare = True
        log.warning(
            "%s runs without a sandbox (sandbox='none'): the command can read and write whatever this user can, "
            "reach any host and outlive the rollout",
            what,
        )
