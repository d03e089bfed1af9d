"""PID 1 of a sandbox: starts the command, relays its LLM and proxy ports, enforces the limits, reports, and takes
every process of the sandbox down with it.

This file runs *inside* the sandbox, by the worker's Python interpreter with `-I -S` (no site, no agl: only the
standard library), as the first process of the sandbox's PID namespace. Being PID 1 is what makes the sandbox's end
certain: when it exits, the kernel kills every process left in the namespace, daemons the command double-forked
included. Its duties, in order:

1. listen on `127.0.0.1:PORT` for each relayed port and carry every connection to a Unix socket bound in from the
   host (the network namespace has nothing else: agl's LLM routes and the egress proxy are the only ways out);
2. start the command with the per-process limits (`setrlimit`: processes, open files, CPU time, file size);
3. watch the sandbox as a whole (processes, resident memory, the writable folders' size) and, on a breach, report it
   and kill everything; reap orphans; report how each process that a limit killed ended (SIGXCPU, SIGXFSZ);
4. when the command ends: report its exit, kill what it left behind (reporting how many), exit with its status.

Reports are lines on a descriptor the host passed in (`status_fd`), never in a file the command could write.
It is not dumpable, so the command (same user, no capabilities) cannot ptrace it or read its descriptors, and as
PID 1 it receives no signal from inside the namespace that it has no handler for.
"""

from __future__ import annotations

import _signal as signal  # `signal` without its enum of names (enum's import alone costs ~3 ms)
import _thread
import marshal
import os
import resource
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations are never evaluated here: typing is not imported when it runs
    from typing import Any

POLL_S = 0.05  # processes and memory: a fork or memory bomb is stopped within about this long
SLOW_POLL_S = 0.5  # disk usage and open files: walking the folders costs more
_PAGE = os.sysconf("SC_PAGE_SIZE")
_status_lock = _thread.allocate_lock()
_limits: dict[str, Any] = {}
# Started for every command, so it starts fast (a rollout may run many): no json, re, subprocess, threading, typing
# or signal's enum (~20 ms of imports on 2 cores), only built-in modules; its configuration comes as marshal (the
# same interpreter wrote it), its reports as plain lines `event key=value ...` (values without spaces, but the last,
# `message=`, which runs to the line's end).


def main() -> int:
    config = marshal.loads(bytes.fromhex(sys.argv[1]))
    _limits.update(config["limits"])
    if "status_path" in config:  # a container: a file bound in (a runtime passes no descriptor through)
        status_fd = os.open(config["status_path"], os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    else:
        status_fd = int(config["status_fd"])
    os.set_inheritable(status_fd, False)

    def report(event: str, **fields: Any) -> None:
        message = fields.pop("message", None)
        line = " ".join([event, *(f"{k}={v}" for k, v in fields.items())])
        if message is not None:
            line += " message=" + str(message).replace("\n", " ")
        with _status_lock:
            try:
                os.write(status_fd, (line + "\n").encode())
            except OSError:
                pass

    # bound before the command starts, so its first connection is queued; accepted by threads started after the fork
    listeners = [(_listen(int(port)), path) for port, path in config["relays"]]
    terminating: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: terminating.append(True))  # the host's request to stop (its time limit)
    # a child's end wakes the wait below at once (sigtimedwait), rather than at the next poll
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    limits = config["limits"]
    pid = _start(config["argv"], config["cwd"], limits, status_fd)
    if pid is None:
        return 127
    report("started", pid=pid)
    _not_dumpable()  # after the start: it costs a few ms of import the command need not wait for
    for server, path in listeners:
        _thread.start_new_thread(_accept, (server, path))
    code = _supervise(pid, limits, config["watch"], report, terminating)
    left = _kill_all()
    _disk_breached(limits, config["watch"], report)  # a file cut at the size limit by a process that went on
    if left:
        report("left_behind", processes=left)
    report("exit", code=code)
    return code if code >= 0 else 128 - code


def _start(argv: list[str], cwd: str, limits: dict[str, Any], status_fd: int) -> int | None:
    """fork + exec the command in a session of its own with the per-process limits; None if it could not start (the
    reason reported on the status line by the child)."""
    ready_r, ready_w = os.pipe()  # closed by the exec (close-on-exec): its end says the command started
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready_r)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
            # Python ignores SIGPIPE and SIGXFSZ; exec keeps what is ignored, so they are put back, as subprocess does
            for sig in (signal.SIGTERM, signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(sig, signal.SIG_DFL)
            _apply_rlimits(limits)
            os.chdir(cwd)
            os.execvp(argv[0], argv)
        except OSError as exc:
            line = f"start_failed message={argv[0]}: {exc.strerror or exc}\n"
            os.write(status_fd, line.encode())
            os.write(ready_w, b"x")
        finally:
            os._exit(127)
    os.close(ready_w)
    failed = os.read(ready_r, 1)
    os.close(ready_r)
    if failed:
        os.waitpid(pid, 0)
        return None
    return pid


def _supervise(leader: int, limits: dict[str, Any], watch: list[str], report: Any, terminating: Any) -> int:
    """Wait for the command while watching the sandbox; its exit code (negative: the signal that ended it)."""
    next_slow = 0.0
    code: int | None = None
    while code is None:
        code = _reap(leader, report)
        if code is not None:
            break
        if terminating:
            report("terminated")
            _signal_all(signal.SIGTERM)
            deadline = time.monotonic() + float(limits.get("grace_s", 2.0))
            while code is None and time.monotonic() < deadline:
                signal.sigtimedwait({signal.SIGCHLD}, POLL_S)
                code = _reap(leader, report)
            return code if code is not None else -signal.SIGKILL
        pids = _pids()
        watched = not limits.get("kernel_enforced")  # else a cgroup counts both, exactly (cgroups.py)
        if watched and limits.get("processes") and len(pids) > int(limits["processes"]):
            # the kernel's own limit (a cgroup, or RLIMIT_NPROC) refuses forks past it; this catches where neither can
            report("breach", limit="processes", allowed=int(limits["processes"]), seen=len(pids))
            return _breach_exit(leader)
        if watched and limits.get("memory_mb"):
            used = sum(_memory(p) for p in pids)
            if used > int(limits["memory_mb"]) * 2**20:
                report("breach", limit="memory_mb", allowed=int(limits["memory_mb"]), seen=used // 2**20)
                return _breach_exit(leader)
        now = time.monotonic()
        if now >= next_slow:
            if _disk_breached(limits, watch, report):
                return _breach_exit(leader)
            # a big repository takes a while to walk: at most ~5 % of a core goes to it
            next_slow = time.monotonic() + max(SLOW_POLL_S, 20 * (time.monotonic() - now))
            if limits.get("open_files"):
                most = max((_open_files(p) for p in pids), default=0)
                if most >= int(limits["open_files"]):
                    # the kernel refused the next open already (EMFILE); said once, the command goes on
                    report("breach", limit="open_files", allowed=int(limits["open_files"]), seen=most)
                    limits = {**limits, "open_files": None}
        signal.sigtimedwait({signal.SIGCHLD}, POLL_S)
    return code


def _reap(leader: int, report: Any) -> int | None:
    """Reap every ended process (PID 1 inherits the orphans); the leader's exit code once it has ended."""
    code = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return code
        if pid == 0:
            return code
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            limit = {signal.SIGXCPU: "cpu_s", signal.SIGXFSZ: "disk_mb"}.get(sig)
            if limit is not None:
                report("breach", limit=limit, allowed=_limits.get(limit), signal=sig)
            if pid == leader:
                code = -sig
        elif pid == leader:
            code = os.WEXITSTATUS(status)


def _breach_exit(leader: int) -> int:
    _kill_all()
    try:
        _, status = os.waitpid(leader, 0)
    except ChildProcessError:
        return -int(signal.SIGKILL)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _pids() -> list[int]:
    me = os.getpid()
    return [int(n) for n in os.listdir("/proc") if n.isdigit() and int(n) != me]


def _memory(pid: int) -> int:
    """Its proportional set size: resident pages, each shared page divided among its sharers (forked children share
    their parent's pages until they write them: resident sizes summed would count those many times)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def _open_files(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def _disk_breached(limits: dict[str, Any], watch: list[str], report: Any) -> bool:
    """Whether the writable folders hold more than the limit (reported), or a file reached it (`RLIMIT_FSIZE` cut a
    write there: reported once, as the process that hit it may have been a grandchild this one never reaps)."""
    allowed = limits.get("disk_mb")
    if not allowed or not watch:
        return False
    used, largest = 0, 0
    for path in watch:
        total, big = _disk_usage(path)
        used, largest = used + total, max(largest, big)
    if used > int(allowed) * 2**20:
        report("breach", limit="disk_mb", allowed=int(allowed), seen=used // 2**20)
        return True
    if largest >= int(allowed) * 2**20 and not limits.get("file_reported"):
        limits["file_reported"] = True
        report("breach", limit="disk_mb", allowed=int(allowed), seen=largest // 2**20, file=1)
    return False


def _disk_usage(root: str) -> tuple[int, int]:
    """Bytes allocated under `root` (blocks, so sparse files count what they use), links not followed; and the
    largest file's apparent size."""
    total = largest = 0
    stack = [root]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += info.st_blocks * 512
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                else:
                    largest = max(largest, info.st_size)
    return total, largest


def _signal_all(sig: int) -> None:
    try:
        os.kill(-1, sig)  # from PID 1: every process of the namespace but itself
    except ProcessLookupError:
        pass


def _kill_all() -> int:
    """SIGKILL every other process of the sandbox and reap them; how many there were."""
    left = len(_pids())
    _signal_all(signal.SIGKILL)
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return left


def _apply_rlimits(limits: dict[str, Any]) -> None:
    os.setsid()
    for name, key, scale in (
        ("RLIMIT_NPROC", "processes", 1),
        ("RLIMIT_NOFILE", "open_files", 1),
        ("RLIMIT_CPU", "cpu_s", 1),
        ("RLIMIT_FSIZE", "disk_mb", 2**20),
    ):
        value = limits.get(key)
        if value:
            soft = int(value) * scale
            hard = soft + 1 if key == "cpu_s" else soft  # SIGXCPU at the soft limit, SIGKILL a second later
            resource.setrlimit(getattr(resource, name), (soft, hard))


def _not_dumpable() -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (ImportError, OSError, AttributeError):
        pass


def _listen(port: int) -> Any:
    # `_socket`, the C module: `socket`'s wrapper imports enum (~3 ms); its sockets are close-on-exec as well
    import _socket

    server = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    server.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen(128)
    return server


def _accept(server: Any, unix_path: str) -> None:
    import _socket

    while True:
        try:
            fd, _ = server._accept()
        except OSError:
            return
        _thread.start_new_thread(_connect, (_socket.socket(fileno=fd), unix_path))


def _connect(client: Any, unix_path: str) -> None:
    import _socket

    upstream = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        upstream.connect(unix_path)
    except OSError:
        client.close()
        upstream.close()
        return
    done = _thread.allocate_lock()
    done.acquire()
    _thread.start_new_thread(_pipe, (upstream, client, done))
    _pipe(client, upstream)
    done.acquire()  # released when the other direction has ended
    client.close()
    upstream.close()


def _pipe(source: Any, sink: Any, done: Any = None) -> None:
    import _socket

    try:
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        for sock, how in ((sink, _socket.SHUT_WR), (source, _socket.SHUT_RD)):
            try:
                sock.shutdown(how)
            except OSError:
                pass
        if done is not None:
            done.release()


if __name__ == "__main__":
    sys.exit(main())
