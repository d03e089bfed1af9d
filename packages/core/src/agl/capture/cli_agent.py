"""Command-line agents as rollouts: `agl.workspace(...)` and `agl.run_cli(...)`.

A coding agent that ships as a program (Claude Code, Codex CLI, OpenCode, mini-swe-agent, a script of yours) runs
unchanged inside a rollout function:

    @agl.rollout
    def repair(task, llm):
        with agl.workspace(task["files"]) as ws:
            done = agl.run_cli(["my-agent", "--task", task["prompt"]], llm=llm, agent="my-agent", cwd=ws)
            return run_the_tests(ws)

`workspace(files)` is a fresh folder with a copy of the task's files, deleted afterwards. `run_cli` runs the
command there with the attempt's LLM endpoint in the variables OpenAI's and Anthropic's clients read
(`OPENAI_BASE_URL`, `OPENAI_API_BASE`, `OPENAI_API_KEY`, `ANTHROPIC_BASE_URL`, `ANTHROPIC_API_KEY`), the URL naming
`agent` (`/rollout/R/attempt/A/agent/NAME/v1`: agl's HTTP hook is not in that process, so the URL carries what its
headers would), in a process group of its own: on its time limit, or when the rollout is cancelled, the whole tree
is killed (SIGTERM, then SIGKILL). Its output goes to a transcript file; the result keeps the tail, and a span
`cli:<program>` records the exit, the time and the tail in the rollout.

What isolation this gives, and what it does not: the command runs as the worker's user, in its own folder and
process group, with optional limits on its address space and processes (`max_memory_mb`, `max_processes`, through
`setrlimit`: the process limit counts every process of that user). It can read and write whatever that user can,
and reach the network. Run the workers in containers (one per worker, the run's server reachable from them) where
an agent's commands must not touch the machine.
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
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlsplit

from agl.capture.egress import PROXY_VARIABLES, EgressMode, EgressRecorder
from agl.capture.llm import LLM
from agl.capture.tracing.spans import record_span

TAIL_CHARS = 4000
log = logging.getLogger("agl.worker")
# what the command's own environment must not inherit from the worker: the worker's rollout ids and its run's
# fixed URL would attribute its calls to the worker instead of the attempt
_WORKER_ONLY = ("AGL_LLM_BASE_URL", "AGL_TOKEN")


@dataclass(frozen=True)
class CliResult:
    returncode: int | None  # None: killed (its time limit, or the rollout was cancelled)
    timed_out: bool
    seconds: float
    output_tail: str  # the last TAIL_CHARS characters of its output (stdout and stderr together)
    transcript: Path  # all of it
    # what its process tree connected to besides agl, `host:port` → connections (agl.capture.egress); empty with
    # egress="allow" or when the worker's own environment already names a proxy
    egress: dict[str, int] = field(default_factory=dict)


@contextlib.contextmanager
def workspace(files: str | os.PathLike[str] | None = None, *, keep: bool = False) -> Iterator[Path]:
    """A fresh folder holding a copy of `files` (a folder, or nothing), deleted on leaving unless `keep`."""
    folder = Path(tempfile.mkdtemp(prefix="agl-workspace-"))
    try:
        if files is not None:
            source = Path(files)
            if not source.is_dir():
                raise FileNotFoundError(f"agl.workspace: {source} is not a folder to copy into the workspace")
            shutil.copytree(source, folder, dirs_exist_ok=True, symlinks=True)
        yield folder
    finally:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)


def agent_url(llm: LLM, agent: str | None) -> str:
    """The attempt's LLM URL, naming `agent` when given (`.../agent/NAME/v1`)."""
    if agent is None:
        return llm.base_url
    return f"{llm.anthropic_base_url}/agent/{quote(agent, safe='')}/v1"  # the URL without its /v1, as there


def cli_environment(llm: LLM, agent: str | None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The command's environment: the worker's, less its own agl variables, with the attempt's endpoint in every
    variable OpenAI's and Anthropic's clients read, then `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in _WORKER_ONLY}
    url = agent_url(llm, agent)
    env.update(
        {
            "OPENAI_BASE_URL": url,
            "OPENAI_API_BASE": url,
            "OPENAI_API_KEY": llm.api_key,
            "ANTHROPIC_BASE_URL": url.removesuffix("/v1"),
            "ANTHROPIC_API_KEY": llm.api_key,
        }
    )
    env.update(extra or {})
    return env


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
    egress: EgressMode = "record",
    stdin: str | None = None,
) -> CliResult:
    """Run a command-line agent against the attempt's LLM endpoint (see the module's docstring) and wait for it,
    at most `timeout_s`. Its output goes to `transcript` (default: `.agl-transcript.txt` in `cwd`, else a temporary
    file). `stdin`: text the command reads on its standard input (else it reads none: nobody is at a terminal). Every
    connection its process tree makes through the proxy variables to another host than agl is
    counted (`egress="record"`, forwarded; `"refuse"`: refused with a 403; `"allow"`: not watched): the result's
    `egress` and the span's `cli.egress`. Never raises for the command's own failure: the result says how it ended."""
    if not argv:
        raise ValueError("agl.run_cli needs a command: a non-empty list of arguments")
    folder = Path(cwd) if cwd is not None else None
    if transcript is None:
        transcript = (folder or Path(tempfile.mkdtemp(prefix="agl-cli-"))) / ".agl-transcript.txt"
    out_path = Path(transcript)
    limits = _limits(max_memory_mb, max_processes)
    t0, started = time.monotonic(), time.time()
    timed_out = False
    environment = cli_environment(llm, agent, env)
    recorder = _recorder(egress, llm, environment)
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(out_path.open("wb"))
        if recorder is not None:
            stack.enter_context(recorder)
            environment.update(recorder.environment([urlsplit(llm.base_url).hostname or "localhost"]))
        # a prompt given on standard input reaches the agent as it is, where an argument may be quoted by the program
        stdin_file = stack.enter_context(tempfile.TemporaryFile()) if stdin is not None else None
        if stdin_file is not None:
            stdin_file.write((stdin or "").encode())
            stdin_file.seek(0)
        proc = subprocess.Popen(
            list(argv),
            cwd=folder,
            env=environment,
            stdin=stdin_file if stdin_file is not None else subprocess.DEVNULL,
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
    if seen:
        log.warning(
            "%s connected to hosts other than agl: %s", argv[0], ", ".join(f"{h} ({n})" for h, n in seen.items())
        )
    returncode = None if timed_out or (proc.returncode or 0) < 0 else proc.returncode
    tail = _tail(out_path)
    seconds = time.monotonic() - t0
    name = Path(argv[0]).name
    how = "timed out" if timed_out else f"exit {proc.returncode}"
    record_span(
        f"cli:{name}",
        kind="tool",
        start_time=started,
        status="ok" if returncode == 0 else "error",
        status_message=None if returncode == 0 else f"{name}: {how}",
        attributes={
            "cli.argv": list(argv)[:64],
            "cli.exit": how,
            "cli.output_tail": tail[-TAIL_CHARS:],
            "cli.egress": [f"{host} ({n})" for host, n in sorted(seen.items())],
        },
        agent_name=agent,
    )
    return CliResult(returncode, timed_out, seconds, tail, out_path, seen)


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
