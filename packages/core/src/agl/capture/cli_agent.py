"""Command-line agents as rollouts: `agl.workspace(...)` and `agl.run_cli(...)`.

A coding agent that ships as a program (Claude Code, Codex CLI, OpenCode, mini-swe-agent, a script of yours) runs
unchanged inside a rollout function:

    @agl.rollout
    def repair(task, llm):
        with agl.workspace(task["files"]) as ws:
            done = agl.run_cli(["my-agent", "--task", task["prompt"]], llm=llm, agent="my-agent", cwd=ws)
            return 1.0 if agl.run_sandboxed(["python", "-m", "pytest"], cwd=ws).returncode == 0 else 0.0

`workspace(files)` is a fresh folder with a copy of the task's files, deleted afterwards, beside (never inside) the
command's private home and its transcripts (`agent_home(ws)`). `run_cli` runs the command there, in a sandbox by
default (agl.capture.sandbox, docs/security.md): the system read-only, its workspace and home the only writable
places, no network but the attempt's LLM routes (every other host refused unless the task's `Sandbox(network=...)`
says otherwise), its own PID namespace (the whole tree dies with it: at the end, on its time limit, on a limit's
breach), limits on memory, processes, CPU time, open files and disk. Its LLM endpoint is in the variables OpenAI's
and Anthropic's clients read (`OPENAI_BASE_URL`, `OPENAI_API_BASE`, `OPENAI_API_KEY`, `ANTHROPIC_BASE_URL`,
`ANTHROPIC_API_KEY`), the URL naming `agent` (`/rollout/R/attempt/A/agent/NAME/v1`: agl's HTTP hook is not in that
process, so the URL carries what its headers would); in a sandbox its keys are placeholders, the relay sending the
attempt's LLM-only credential. Its output goes to a transcript; the result keeps the tail, and a span `cli:<program>`
records the exit, the time, the tail and each limit it breached.

Where the sandbox cannot start, `run_cli` refuses (`SandboxUnavailable`, saying how to install bubblewrap) unless
the caller opts out with `sandbox="none"`: then the command runs as the worker's user with everything that user has
(a warning says so once), in its own process group, with `max_memory_mb` / `max_processes` as `setrlimit`s only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

from agl.capture.egress import PROXY_VARIABLES, EgressMode, EgressRecorder
from agl.capture.llm import LLM, agent_url
from agl.capture.sandbox.kinds import launch_class
from agl.capture.sandbox.launch import PLACEHOLDER_KEY, LlmRoute
from agl.capture.sandbox.policy import Sandbox, as_sandbox, warn_bare_once
from agl.capture.tracing.spans import record_span

TAIL_CHARS = 4000
log = logging.getLogger("agl.worker")
# what the command's own environment must not inherit from the worker: the worker's rollout ids and its run's
# fixed URL would attribute its calls to the worker instead of the attempt; the token opens the whole server
_WORKER_ONLY = ("AGL_LLM_BASE_URL", "AGL_TOKEN")
_MARKER = ".agl-rollout"  # in a workspace's parent: made by `workspace`, holding its home and transcripts
_roots_lock = threading.Lock()


@dataclass(frozen=True)
class CliResult:
    returncode: int | None  # None: killed (its time limit, a sandbox limit, or the rollout was cancelled)
    timed_out: bool
    seconds: float
    output_tail: str  # the last TAIL_CHARS characters of its output (stdout and stderr together)
    transcript: Path  # all of it (outside the workspace)
    # what its process tree connected to besides agl, `host:port` → connections (agl.capture.egress); empty with
    # egress="allow" or, bare, when the worker's own environment already names a proxy
    egress: dict[str, int] = field(default_factory=dict)
    breaches: list[str] = field(default_factory=list)  # each sandbox limit it breached, said in words
    left_behind: int = 0  # processes still running when it ended (killed with the sandbox)
    home: Path | None = None  # its private home (outside the workspace): a harness's config, sessions, trajectories
    sandbox: str = "bwrap"  # how it was confined: bwrap, container, none


@contextlib.contextmanager
def workspace(files: str | os.PathLike[str] | None = None, *, keep: bool = False) -> Iterator[Path]:
    """A fresh folder holding a copy of `files` (a folder, or nothing), deleted on leaving unless `keep`. Beside it,
    not in it: the private home of the commands run there (`agent_home`) and their transcripts."""
    root = Path(tempfile.mkdtemp(prefix="agl-rollout-"))
    folder = root / "workspace"
    try:
        (root / _MARKER).touch()
        (root / "home").mkdir()
        if files is not None:
            source = Path(files)
            if not source.is_dir():
                raise FileNotFoundError(f"agl.workspace: {source} is not a folder to copy into the workspace")
            shutil.copytree(source, folder, symlinks=True)
        else:
            folder.mkdir()
        yield folder
    finally:
        if not keep:
            _remove(root)


def agent_home(ws: str | os.PathLike[str]) -> Path:
    """The private home of the commands `run_cli` runs in the workspace `ws` (made by `agl.workspace`, or a folder in
    it): their `HOME`,
    outside the workspace, so an agent's own searches never find its configuration or earlier outputs. A harness's
    trajectory or session file is read from there."""
    root = _rollout_root(Path(ws))
    if root is None:
        raise ValueError(f"agl.agent_home: {ws} is not in a folder made by agl.workspace()")
    return root / "home"


def _rollout_root(folder: Path) -> Path | None:
    """The folder `agl.workspace` made that `folder` (its workspace, or a folder in it) is in."""
    where = Path(os.path.abspath(folder))
    for parent in where.parents:
        if (parent / _MARKER).is_file() and (parent / "workspace") in (where, *where.parents):
            return parent
    return None


def cli_environment(llm: LLM, agent: str | None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a command run bare: the worker's, less its own agl variables, with the attempt's endpoint
    in every variable OpenAI's and Anthropic's clients read, then `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in _WORKER_ONLY}
    env.update(llm_variables(agent_url(llm, agent), llm.api_key))
    env.update(extra or {})
    return env


def llm_variables(url: str, key: str) -> dict[str, str]:
    return {
        "OPENAI_BASE_URL": url,
        "OPENAI_API_BASE": url,
        "OPENAI_API_KEY": key,
        "ANTHROPIC_BASE_URL": url.removesuffix("/v1"),
        "ANTHROPIC_API_KEY": key,
    }


def run_cli(
    argv: Sequence[str],
    *,
    llm: LLM,
    agent: str | None = None,
    cwd: str | os.PathLike[str] | None = None,
    timeout_s: float = 600.0,
    env: Mapping[str, str] | None = None,
    transcript: str | os.PathLike[str] | None = None,
    max_memory_mb: int | None = None,
    max_processes: int | None = None,
    egress: EgressMode | None = None,
    stdin: str | None = None,
    sandbox: Sandbox | str | None = None,
) -> CliResult:
    """Run a command-line agent against the attempt's LLM endpoint (see the module's docstring) and wait for it,
    at most `timeout_s`. `cwd`: its workspace (from `agl.workspace`; else a fresh temporary folder), the one place it
    may write besides its home. `sandbox`: a `Sandbox` (what else it may read or write, its network, its limits),
    `"none"` to run it bare, or None for the default sandbox; `max_memory_mb` / `max_processes` change those limits.
    Its output goes to `transcript` (default: a file beside the workspace). `stdin`: text the command reads on its
    standard input (else it reads none: nobody is at a terminal). Connections to hosts other than agl go through
    the egress proxy: `egress` (default: the sandbox's `network`, `"refuse"`; bare, `"record"`) says whether they
    are refused (403), recorded and forwarded, or allowed; the result's `egress` and the span's `cli.egress` count
    them. Never raises for the command's own failure: the result says how it ended. Raises `SandboxUnavailable` when
    the sandbox cannot start here (the message says how to install it, or to pass `sandbox="none"`)."""
    if not argv:
        raise ValueError("agl.run_cli needs a command: a non-empty list of arguments")
    box = as_sandbox(sandbox).with_limits(memory_mb=max_memory_mb, processes=max_processes)
    if egress is not None:
        box = replace(box, network=egress)
    folder = Path(cwd) if cwd is not None else Path(tempfile.mkdtemp(prefix="agl-cli-"))
    home, out_path = _places(folder, argv[0], transcript)
    t0, started = time.monotonic(), time.time()
    if box.bare:
        warn_bare_once("agl.run_cli")
        network = egress or "record"
        outcome = _run_bare(argv, llm, agent, folder, home, out_path, env, stdin, timeout_s, box, network)
    else:
        outcome = _run_sandboxed(argv, llm, agent, folder, home, out_path, env, stdin, timeout_s, box)
    if outcome.egress:
        log.warning(
            "%s connected to hosts other than agl: %s",
            argv[0],
            ", ".join(f"{h} ({n})" for h, n in outcome.egress.items()),
        )
    tail = _tail(out_path)
    seconds = time.monotonic() - t0
    name = Path(argv[0]).name
    returncode = outcome.returncode
    if outcome.timed_out:
        how = "timed out"
    elif outcome.breaches:
        how = "; ".join(outcome.breaches)
    else:
        how = f"exit {outcome.raw_exit}"
    span_id = record_span(
        f"cli:{name}",
        kind="tool",
        start_time=started,
        status="ok" if returncode == 0 else "error",
        status_message=None if returncode == 0 else f"{name}: {how}",
        attributes={
            "cli.argv": list(argv)[:64],
            "cli.exit": how,
            "cli.output_tail": tail[-TAIL_CHARS:],
            "cli.egress": [f"{host} ({n})" for host, n in sorted(outcome.egress.items())],
            "cli.sandbox": box.kind,
            "cli.left_behind": outcome.left_behind,
        },
        agent_name=agent,
    )
    for limit, said in outcome.limits:
        record_span(
            f"sandbox.limit:{limit}",
            kind="sandbox",
            start_time=started,
            status="error",
            status_message=said,
            attributes={"sandbox.limit": limit, "sandbox.program": name},
            agent_name=agent,
            parent_id=span_id,
        )
    return CliResult(
        returncode,
        outcome.timed_out,
        seconds,
        tail,
        out_path,
        outcome.egress,
        outcome.breaches,
        outcome.left_behind,
        home,
        box.kind,
    )


@dataclass
class Outcome:
    """How one run ended, whatever confined it."""

    returncode: int | None
    timed_out: bool
    raw_exit: int | None
    egress: dict[str, int] = field(default_factory=dict)
    limits: list[tuple[str, str]] = field(default_factory=list)  # (limit, what happened), one per breach
    left_behind: int = 0

    @property
    def breaches(self) -> list[str]:
        return [said for _, said in self.limits]


def _run_sandboxed(
    argv: Sequence[str],
    llm: LLM,
    agent: str | None,
    folder: Path,
    home: Path,
    out_path: Path,
    env: Mapping[str, str] | None,
    stdin: str | None,
    timeout_s: float,
    box: Sandbox,
) -> Outcome:
    base = agent_url(llm, agent)
    route = LlmRoute.of(llm.base_url, llm.api_key if llm.api_key != "agl" else None)
    inside = route.inside_url().removesuffix("/v1") + base.removeprefix(llm.base_url.removesuffix("/v1"))
    variables = {**llm_variables(inside, PLACEHOLDER_KEY), **(env or {})}
    timed_out = False
    with contextlib.ExitStack() as stack:
        launch_type = launch_class(box)  # bubblewrap, or a container for a task that names an image
        launch = stack.enter_context(launch_type(argv, sandbox=box, cwd=folder, home=home, env=variables, llm=route))
        out = stack.enter_context(out_path.open("wb"))
        stdin_file = _stdin_file(stack, stdin)
        process = launch.popen(stdin=stdin_file or subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        try:
            timed_out = not launch.wait(timeout_s)
        finally:  # ended, timed out, or the rollout cancelled: nothing it started outlives the rollout
            launch.stop()
    if launch.start_error:
        with out_path.open("ab") as f:
            f.write(f"agl: the command did not start: {launch.start_error}\n".encode())
    if launch.relay_refused:
        log.warning("%s asked agl for routes outside its attempt's LLM: %s", argv[0], ", ".join(launch.relay_refused))
    limits = [(b.limit, b.describe()) for b in launch.breaches]
    if timed_out:
        limits.append(("timeout_s", f"the command's time limit ({timeout_s:g} s) was reached"))
    code = None if timed_out else launch.exit_code()
    return Outcome(code, timed_out, process.returncode, launch.egress, limits, launch.left_behind)


def _run_bare(
    argv: Sequence[str],
    llm: LLM,
    agent: str | None,
    folder: Path,
    home: Path,
    out_path: Path,
    env: Mapping[str, str] | None,
    stdin: str | None,
    timeout_s: float,
    box: Sandbox,
    network: EgressMode,
) -> Outcome:
    environment = cli_environment(llm, agent, {"HOME": str(home), **(env or {})})
    recorder = _recorder(network, llm, environment)
    limits = _limits(box.limits.memory_mb, box.limits.processes)
    timed_out = False
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(out_path.open("wb"))
        if recorder is not None:
            stack.enter_context(recorder)
            environment.update(recorder.environment([urlsplit(llm.base_url).hostname or "localhost"]))
        stdin_file = _stdin_file(stack, stdin)
        proc = subprocess.Popen(
            list(argv),
            cwd=folder,
            env=environment,
            stdin=stdin_file or subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the whole tree is killed with it
            preexec_fn=limits,
        )
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:  # ended, timed out, or the rollout cancelled: nothing it started outlives the rollout
            _stop_group(proc)
    seen = recorder.seen() if recorder is not None else {}
    returncode = None if timed_out or (proc.returncode or 0) < 0 else proc.returncode
    return Outcome(returncode, timed_out, proc.returncode, seen)


def _stdin_file(stack: contextlib.ExitStack[bool | None], stdin: str | None) -> IO[bytes] | None:
    """A prompt given on standard input reaches the agent as it is, where an argument may be quoted by the program."""
    if stdin is None:
        return None
    f = stack.enter_context(tempfile.TemporaryFile())  # noqa: SIM115 - the stack closes it
    f.write(stdin.encode())
    f.seek(0)
    return f


def _places(folder: Path, program: str, transcript: str | os.PathLike[str] | None) -> tuple[Path, Path]:
    """The command's private home and its transcript's path: beside a workspace made by `agl.workspace`, else in a
    temporary folder of their own; never inside the workspace."""
    root = _rollout_root(folder) or Path(tempfile.mkdtemp(prefix="agl-cli-"))
    home = root / "home"
    home.mkdir(exist_ok=True)
    if transcript is not None:
        return home, Path(transcript)
    with _roots_lock:
        n = 1
        while (root / f"transcript-{Path(program).name}-{n}.txt").exists():
            n += 1
        out_path = root / f"transcript-{Path(program).name}-{n}.txt"
        out_path.touch()
    return home, out_path


def _remove(root: Path) -> None:
    """Delete a rollout's folder whatever its command left in it (folders it made unreadable included)."""

    def retry(function: Callable[..., object], path: str, _: object) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(path), 0o700)
            os.chmod(path, 0o700)
            function(path)

    shutil.rmtree(root, onerror=retry)


def _recorder(mode: EgressMode, llm: LLM, environment: Mapping[str, str]) -> EgressRecorder | None:
    """The egress proxy for one command, or None: not asked for, or the environment already routes through a proxy
    of its own (a company's: agl does not stand in front of it)."""
    if mode == "allow":
        return None
    if any(environment.get(name) for name in PROXY_VARIABLES):
        return None
    url = urlsplit(llm.base_url)
    own = {f"{url.hostname}:{url.port or (443 if url.scheme == 'https' else 80)}"}
    return EgressRecorder(refuse=mode == "refuse", own=own)


def _stop_group(proc: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(grace_s)
            if sig is signal.SIGTERM:  # the leader is gone; its children may not be
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(path: Path) -> str:
    with path.open("rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 4 * TAIL_CHARS))
        return f.read().decode(errors="replace")[-TAIL_CHARS:]


def _limits(max_memory_mb: int | None, max_processes: int | None) -> Callable[[], None] | None:
    """A `preexec_fn` that sets the limits (None when there are none, or off Unix)."""
    if (max_memory_mb is None and max_processes is None) or not sys.platform.startswith(("linux", "darwin")):
        return None
    import resource

    def apply() -> None:
        if max_memory_mb is not None:
            size = max_memory_mb * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (size, size))
        if max_processes is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (max_processes, max_processes))

    return apply
