"""bubblewrap (`bwrap`): whether it can start here, and the command line of one sandbox.

The sandbox has a namespace of each kind of its own (user, PID, network, IPC, UTS, cgroup), is one user (uid
1000, no capabilities, no further user namespaces), sees the file system `mounts.py` lists, and starts with
`supervisor.py` as its PID 1 (`--as-pid-1`): when that process ends, or bwrap's parent (the worker) dies
(`--die-with-parent`), every process inside dies. `--new-session` keeps the command off the worker's terminal.
"""

from __future__ import annotations

import functools
import marshal
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agl.capture.sandbox import mounts

SUPERVISOR = Path(__file__).with_name("supervisor.py")
INSIDE_RUN = "/run/agl"
INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`; Fedora: `dnf install bubblewrap`; "
    "Arch: `pacman -S bubblewrap`), or opt out with sandbox='none' (the command then runs with everything this "
    "user has: see docs/security.md)"
)


@dataclass
class Plan:
    """One sandbox: what it shows, what it runs, and how its first process is configured."""

    argv: list[str]
    cwd: str
    read_only: list[str]
    writable: list[str]
    tmp_mb: int
    home: str
    passwd: str  # host paths of the sandbox's /etc/passwd, /etc/group and /etc/hosts
    group: str
    hosts: str
    socket_dir: str | None  # the host folder of the relays' Unix sockets, shown at /run/agl/sock
    supervisor_config: dict[str, object] = field(default_factory=dict)

    def command(self) -> list[str]:
        python = os.path.realpath(sys.executable)
        args = ["bwrap", "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
        args += ["--unshare-cgroup-try", "--disable-userns", "--uid", str(mounts.SANDBOX_UID)]
        args += ["--gid", str(mounts.SANDBOX_UID), "--hostname", "agl-sandbox"]
        args += ["--die-with-parent", "--new-session", "--as-pid-1"]
        for path in mounts.SYSTEM:
            if os.path.islink(path):
                args += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                args += ["--ro-bind", path, path]
        args += ["--ro-bind", mounts.etc_folder(), "/etc"]
        args += ["--ro-bind", self.passwd, "/etc/passwd", "--ro-bind", self.group, "/etc/group"]
        args += ["--ro-bind", self.hosts, "/etc/hosts"]
        args += ["--proc", "/proc", "--dev", "/dev", "--size", str(self.tmp_mb * 2**20), "--tmpfs", "/tmp"]
        args += ["--tmpfs", "/run", "--ro-bind", str(SUPERVISOR), f"{INSIDE_RUN}/supervisor.py"]
        if self.socket_dir is not None:
            args += ["--ro-bind", self.socket_dir, f"{INSIDE_RUN}/sock"]
        for path in mounts.outermost([mounts.python_prefix(python), *self.read_only]):
            if os.path.exists(path) and not mounts.is_system(path):
                args += ["--ro-bind", path, path]
        for path in dict.fromkeys([self.home, *self.writable]):
            args += ["--bind", path, path]
        args += ["--chdir", self.cwd, "--", python, "-I", "-S", f"{INSIDE_RUN}/supervisor.py"]
        config = {**self.supervisor_config, "argv": self.argv, "cwd": self.cwd}
        return [*args, marshal.dumps(config).hex()]  # the supervisor reads it without importing json (its start)


@functools.lru_cache(maxsize=1)
def unavailable() -> str | None:
    """Why a bubblewrap sandbox cannot start on this machine, or None when it can (checked once per process)."""
    if not sys.platform.startswith("linux"):
        return f"bubblewrap sandboxes run on Linux only, and this is {sys.platform}; opt out with sandbox='none'"
    if shutil.which("bwrap") is None:
        return f"bubblewrap (bwrap) is not installed: {INSTALL_HINT}"
    probe = ["bwrap", "--unshare-user", "--unshare-pid", "--unshare-net", "--ro-bind", "/", "/", "--proc", "/proc"]
    try:
        done = subprocess.run([*probe, "true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap did not start: {exc}; {INSTALL_HINT}"
    if done.returncode != 0:
        why = done.stderr.strip() or f"exit {done.returncode}"
        return (
            f"bubblewrap cannot create namespaces here ({why}): unprivileged user namespaces are off "
            "(`sysctl kernel.unprivileged_userns_clone=1`; on Ubuntu 24.04 also "
            "`sysctl kernel.apparmor_restrict_unprivileged_userns=0` or an AppArmor profile for bwrap), or opt out "
            "with sandbox='none'"
        )
    return None


def visible_paths(argv: Sequence[str], env: dict[str, str], extra: Sequence[str]) -> list[str]:
    """Read-only paths beside the system: the program's own files, then what the task names."""
    return [*mounts.program_paths(argv, env), *extra]
