"""One sandboxed command on the host's side: set up what it needs, start it, stop it, say what it breached.

`Launch` is a context manager. On entry: a private folder for the sandbox's own files (its `/etc/passwd`, the
relays' sockets), the LLM relay (llm_relay.py) when the command has an attempt to call, the egress proxy (every other
host: refused, recorded or allowed), and a cgroup where one may be made (cgroups.py). `popen(...)` starts bwrap
with the supervisor as PID 1; `stop()` asks the sandbox to end (SIGTERM to every process inside) and kills it after a
grace period; on exit everything is taken down and the report is complete: how the command ended, each limit it
breached, how many processes it left behind, which hosts it tried.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from agl.capture.egress import PROXY_VARIABLES, EgressRecorder
from agl.capture.sandbox import bwrap, mounts
from agl.capture.sandbox.cgroups import Cgroup
from agl.capture.sandbox.llm_relay import LlmRelay
from agl.capture.sandbox.policy import Sandbox

log = logging.getLogger("agl.sandbox")
EGRESS_PORT = 3128
CGROUP_POLL_S = 0.1
# what the command's environment keeps of the worker's (the rest, API keys of the worker's own included, stays out)
KEPT_VARIABLES = ("PATH", "LANG", "LANGUAGE", "TERM", "TZ", "COLORTERM", "NO_COLOR", "FORCE_COLOR")
PLACEHOLDER_KEY = "agl-sandbox"  # what the command holds as its API key: the relay puts the real credential in


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot start on this machine; the message says how to install it or how to opt out."""


@dataclass(frozen=True)
class LlmRoute:
    """The attempt a sandboxed command may call: agl's server, the attempt's path (`/rollout/R/attempt/A`, the URL
    without its `/v1`) and the credential the relay sends for it."""

    server_url: str
    attempt_path: str
    credential: str | None

    @classmethod
    def of(cls, base_url: str, api_key: str | None) -> LlmRoute:
        url = urlsplit(base_url)
        path = url.path.rstrip("/").removesuffix("/v1")
        return cls(f"{url.scheme}://{url.netloc}", path, api_key)

    @property
    def inside_port(self) -> int:
        url = urlsplit(self.server_url)
        return url.port or (443 if url.scheme == "https" else 80)

    def inside_url(self) -> str:
        """The attempt's base URL as the command sees it: the same as outside when agl's server is on loopback or
        named by a host name (the sandbox's /etc/hosts puts that name on its loopback, where the relay listens);
        `127.0.0.1` with the server's port when it is named by another machine's address."""
        host = urlsplit(self.server_url).hostname or "127.0.0.1"
        if host != "localhost" and (_is_address(host) and host != "127.0.0.1"):
            host = "127.0.0.1"
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{self.inside_port}{self.attempt_path}/v1"


@dataclass
class Breach:
    limit: str  # memory_mb, processes, cpu_s, open_files, disk_mb, timeout_s
    allowed: float | None = None
    seen: float | None = None

    def describe(self) -> str:
        said = f"the sandbox's {self.limit} limit"
        if self.allowed is not None:
            said += f" ({self.allowed:g})"
        return said + (f" was exceeded ({self.seen:g})" if self.seen is not None else " was reached")


class Launch:
    """See the module's docstring. `home` and `cwd` are host folders, shown writable at the same paths."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        sandbox: Sandbox,
        cwd: str | os.PathLike[str],
        home: str | os.PathLike[str],
        env: Mapping[str, str] | None = None,
        llm: LlmRoute | None = None,
    ) -> None:
        if not argv:
            raise ValueError("a sandboxed command needs a non-empty list of arguments")
        why = self.unavailable(sandbox)
        if why is not None:
            raise SandboxUnavailable(f"agl cannot start the sandbox: {why}")
        # a program named by a path runs by that path, normalised: `/x/../y` needs `/x` inside, which may not be there
        program = os.path.abspath(argv[0]) if os.sep in argv[0] else argv[0]
        self.argv = [program, *argv[1:]]
        for kind, paths in (("read_only", sandbox.read_only), ("writable", sandbox.writable)):
            missing = [p for p in paths if not os.path.exists(p)]
            if missing:
                raise ValueError(f"agl sandbox: {kind} names paths that do not exist: {', '.join(missing)}")
        if not os.path.isdir(cwd):
            raise ValueError(f"agl sandbox: the working folder {cwd} does not exist")
        self.sandbox = sandbox
        self.cwd = os.path.abspath(cwd)
        self.home = os.path.abspath(home)
        self.env = dict(env or {})
        self.llm = llm
        self.breaches: list[Breach] = []
        self.left_behind = 0
        self.start_error: str | None = None
        self.egress: dict[str, int] = {}
        self.relay_refused: list[str] = []
        self.process: subprocess.Popen[bytes] | None = None
        self._stack = contextlib.ExitStack()
        self._state = ""
        self._status_reader: threading.Thread | None = None
        self._cgroup: Cgroup | None = None
        self._relay: LlmRelay | None = None
        self._egress: EgressRecorder | None = None
        self._stopping = False
        self._lock = threading.Lock()

    def unavailable(self, sandbox: Sandbox) -> str | None:
        """Why this kind of sandbox cannot start here, or None."""
        return bwrap.unavailable()

    def __enter__(self) -> Launch:
        try:
            self._state = tempfile.mkdtemp(prefix="agl-sandbox-")
            self._stack.callback(shutil.rmtree, self._state, True)
            sockets = os.path.join(self._state, "sock")
            os.mkdir(sockets)
            if self.llm is not None:
                self._relay = self._stack.enter_context(
                    LlmRelay(
                        socket_path=os.path.join(sockets, "llm"),
                        server_url=self.llm.server_url,
                        attempt_path=self.llm.attempt_path,
                        credential=self.llm.credential,
                    )
                )
            self._egress = self._stack.enter_context(
                EgressRecorder(
                    refuse=self.sandbox.network == "refuse",
                    unix_path=os.path.join(sockets, "egress"),
                    count=self.sandbox.network != "allow",
                )
            )
            self._cgroup = self._make_cgroup()
        except BaseException:
            self._stack.close()
            raise
        return self

    def _make_cgroup(self) -> Cgroup | None:
        limits = self.sandbox.limits
        return Cgroup.create(processes=limits.processes, memory_mb=limits.memory_mb)

    def supervisor_config(self, watch_writable: list[str]) -> dict[str, object]:
        """What the sandbox's first process is told: its relays, the limits, the folders to watch."""
        limits = self.sandbox.limits
        relays = []
        if self._relay is not None and self.llm is not None:
            relays.append([self.llm.inside_port, f"{bwrap.INSIDE_RUN}/sock/llm"])
        relays.append([self._egress_port(), f"{bwrap.INSIDE_RUN}/sock/egress"])
        return {
            "relays": relays,
            "limits": {
                "processes": limits.processes,
                "memory_mb": limits.memory_mb,
                "cpu_s": limits.cpu_s,
                "open_files": limits.open_files,
                "disk_mb": limits.disk_mb,
                "kernel_enforced": self._cgroup is not None,
            },
            "watch": list(dict.fromkeys([self.home, *watch_writable])),
        }

    def environment(self) -> dict[str, str]:
        """The command's environment: a few of the worker's variables, a private home and /tmp, the egress proxy,
        then what the caller gave."""
        env = {k: v for k, v in os.environ.items() if k in KEPT_VARIABLES or k.startswith("LC_")}
        env.setdefault("PATH", os.defpath)
        env.update(HOME=self.home, USER=mounts.SANDBOX_USER, LOGNAME=mounts.SANDBOX_USER, TMPDIR="/tmp")
        env["SHELL"] = "/bin/sh"
        proxy = f"http://127.0.0.1:{self._egress_port()}"
        env.update({name: proxy for name in PROXY_VARIABLES})
        env["NO_PROXY"] = env["no_proxy"] = "localhost,127.0.0.1,::1"
        env.update(self.env)
        return env

    def popen(self, **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start the sandbox (stdin, stdout, stderr as for `subprocess.Popen`); `wait` on what it returns."""
        env = self.environment()
        writable = [self.cwd, *self.sandbox.writable]
        read_only = [p for p in bwrap.visible_paths(self.argv, env, self.sandbox.read_only) if p not in writable]
        if "PATH" not in self.env:
            env["PATH"] = mounts.inside_path(env["PATH"], [*read_only, *writable, self.home])
        status_r, status_w = os.pipe()
        state = Path(self._state)
        (state / "passwd").write_text(mounts.passwd_file(self.home))
        (state / "group").write_text(mounts.group_file())
        server_name = urlsplit(self.llm.server_url).hostname if self.llm is not None else None
        (state / "hosts").write_text(mounts.hosts_file([server_name or ""]))
        plan = bwrap.Plan(
            argv=self.argv,
            cwd=self.cwd,
            read_only=read_only,
            writable=writable,
            tmp_mb=self.sandbox.limits.tmp_mb,
            home=self.home,
            passwd=str(state / "passwd"),
            group=str(state / "group"),
            hosts=str(state / "hosts"),
            socket_dir=str(state / "sock"),
            supervisor_config={**self.supervisor_config(writable), "status_fd": status_w},
        )
        cgroup = self._cgroup
        command = plan.command()
        if cgroup is not None:  # bwrap starts inside the cgroup, so everything under it is counted there
            command = ["/bin/sh", "-c", cgroup.join_command() + ' && exec "$@"', "agl-sandbox", *command]
        try:
            self.process = subprocess.Popen(
                command,
                env=env,
                pass_fds=(status_w,),
                start_new_session=True,  # bwrap and everything under it: one group to kill
                **kwargs,
            )
        finally:
            os.close(status_w)
        self._status_reader = threading.Thread(target=self._read_status, args=(status_r,), daemon=True)
        self._status_reader.start()
        if cgroup is not None:
            threading.Thread(target=self._watch_cgroup, args=(cgroup, self.process), daemon=True).start()
        return self.process

    def _watch_cgroup(self, cgroup: Cgroup, process: subprocess.Popen[bytes]) -> None:
        """The cgroup refuses forks past its limit and kills past its memory; a command that hit either is ended
        (a fork bomb would otherwise spin at its limit until its time ran out)."""
        while process.poll() is None:
            hit = cgroup.breaches()
            if hit:
                for limit in hit:
                    self._add_breach(Breach(limit, getattr(self.sandbox.limits, limit)))
                self.stop(grace_s=0.0)
                return
            time.sleep(CGROUP_POLL_S)

    def _add_breach(self, breach: Breach) -> None:
        with self._lock:
            if all(b.limit != breach.limit for b in self.breaches):
                self.breaches.append(breach)

    def stop(self, grace_s: float = 2.0) -> None:
        """End the sandbox: every process inside gets SIGTERM, and after `grace_s` the whole sandbox is killed."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        self._stopping = True
        supervisor = _child_of(process.pid)
        if supervisor is not None:
            with contextlib.suppress(OSError):
                os.kill(supervisor, signal.SIGTERM)  # it forwards to every process inside (supervisor.py)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(grace_s + 1.0)
        if process.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(process.pid, signal.SIGKILL)  # bwrap dies, and with it (--die-with-parent) all inside
            process.wait()

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop(grace_s=0.0)
            if self._status_reader is not None:
                self._status_reader.join(5)
            if self._cgroup is not None:
                for limit in self._cgroup.breaches():
                    self._add_breach(Breach(limit, getattr(self.sandbox.limits, limit)))
                self._cgroup.remove()
            if self._egress is not None:
                self.egress = self._egress.seen()
            if self._relay is not None:
                self.relay_refused = list(self._relay.refused)
        finally:
            self._stack.close()

    def wait(self, timeout_s: float | None) -> bool:
        """Wait for the sandbox to end, at most `timeout_s`; whether it ended. On Linux through a pidfd, woken the
        moment it ends (`Popen.wait` with a time-out polls, sleeping up to 50 ms between looks)."""
        process = self.process
        if process is None:
            return True
        try:
            fd = os.pidfd_open(process.pid)
        except (AttributeError, OSError):
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                return False
            return True
        try:
            ready, _, _ = select.select([fd], [], [], timeout_s)
        finally:
            os.close(fd)
        if ready:
            process.wait()
            return True
        return process.poll() is not None

    def exit_code(self) -> int | None:
        """The command's exit code; None when a signal, a limit or `stop` ended it."""
        process = self.process
        if process is None or process.returncode is None or self._stopping or self.breaches:
            return None
        code = process.returncode
        return None if code < 0 or code > 128 else code

    def _egress_port(self) -> int:
        return EGRESS_PORT if self.llm is None or self.llm.inside_port != EGRESS_PORT else EGRESS_PORT + 1

    def _read_status(self, fd: int) -> None:
        with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as lines:
            for line in lines:
                self._status_line(line)

    def _status_line(self, line: str) -> None:
        """One of the supervisor's reports: `event key=value ...`, a `message=` running to the line's end."""
        head, _, message = line.rstrip("\n").partition(" message=")
        kind, *pairs = head.split(" ")
        event = dict(p.partition("=")[::2] for p in pairs)
        if kind == "breach" and "limit" in event:
            self._add_breach(Breach(event["limit"], _number(event.get("allowed")), _number(event.get("seen"))))
        elif kind == "left_behind":
            self.left_behind = int(_number(event.get("processes")) or 0)
        elif kind == "start_failed":
            self.start_error = message


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "None") else None
    except ValueError:
        return None


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _child_of(pid: int) -> int | None:
    """bwrap's child, the sandbox's PID 1 as the host numbers it."""
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            return None
        if children:
            return int(children[0])
        time.sleep(0.01)
    return None
