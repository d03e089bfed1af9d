"""Score a repaired QuixBugs program: the share of its test cases that pass, each case under a time limit.

`evaluate(task, source)` writes `source` as `python_programs/NAME.py` into a fresh temporary folder beside a copy
of the files its tests need (`task["files"]`, from `task["data_dir"]`; the shared data is never run in place),
and runs `runner.py` there in a child process: it imports the repository's own test module and calls each test
case (one per JSON input/expected pair, or one per test function of the graph programs), reporting each as it
finishes. Each case has `case_timeout_s` (default `CASE_TIMEOUT_S`): the child's alarm stops a slow case; if a
case reports nothing within its limit plus `GRACE_S` (a loop in C code, a bare `except:` that ate the alarm, a
crash), the child's whole process group is killed, the case counts as timed out (or as an error when the child
died), and a new child goes on from the next case. A program gets at most `budget_s` in all (default
`BUDGET_S`): the cases not run by then count as failed (status `not_run`), so a program that hangs on every
input costs a bounded time.

Reward: passed / total, where total counts every case but those the repository's tests skip themselves (one
knapsack and one levenshtein input that run for minutes even when correct; `pytest.run_slow` stays False). A
program that does not parse, or whose tests cannot import it (the function renamed, an error at import), scores
0 with `error` saying why. At the pinned commit every corrected program scores 1.0 and every defective one less.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import agl
from agl_bench.quixbugs.data import PROGRAMS, task_input

CASE_TIMEOUT_S = 6.0  # the slowest corrected case (levenshtein) takes ~2.2 s alone on one core: 2.5x headroom
GRACE_S = 2.0  # past the alarm, before the child is killed (it reports the timeout itself when it can)
STARTUP_S = 10.0  # the child's interpreter and `import pytest` before the first report, on a loaded machine
BUDGET_S = 20.0  # bitcount and sqrt hang on every input: 3 cases of 6 s, then the rest are not run
MEMORY_MB = 2048
RUNNER = Path(__file__).with_name("runner.py")
_READ = 65536


@dataclass(frozen=True)
class CaseResult:
    id: str
    status: str  # passed | failed | error | timeout | skipped | not_run
    message: str = ""


@dataclass
class Evaluation:
    program: str
    cases: list[CaseResult] = field(default_factory=list)
    expected_cases: int = 0  # from the data: the total when the tests never said how many cases they hold
    error: str | None = None  # why no case could run: the program does not parse, or its tests cannot import it
    seconds: float = 0.0
    restarts: int = 0  # children killed (a case that ignored its alarm) or crashed, and started again
    case_ids: list[str] | None = None  # as the tests listed them, once they were imported

    def count(self, *statuses: str) -> int:
        return sum(1 for c in self.cases if c.status in statuses)

    @property
    def passed(self) -> int:
        return self.count("passed")

    @property
    def skipped(self) -> int:
        return self.count("skipped")

    @property
    def timed_out(self) -> int:
        return self.count("timeout")

    @property
    def total(self) -> int:
        return len(self.cases) - self.skipped if self.cases else self.expected_cases

    @property
    def reward(self) -> float:
        return self.passed / self.total if self.total else 0.0

    def summary(self) -> dict[str, Any]:
        """A JSON-able account: the counts, the reward, and each case that did not pass."""
        return {
            "program": self.program,
            "reward": self.reward,
            "passed": self.passed,
            "total": self.total,
            "timed_out": self.timed_out,
            "skipped": self.skipped,
            "not_run": self.count("not_run"),
            "error": self.error,
            "seconds": round(self.seconds, 3),
            "restarts": self.restarts,
            "failures": [asdict(c) for c in self.cases if c.status not in ("passed", "skipped")],
        }


def syntax_error(source: str, name: str) -> str | None:
    """Why `source` is not a Python module, or None."""
    if not source.strip():
        return "the program is empty"
    try:
        compile(source, f"{PROGRAMS}/{name}.py", "exec", dont_inherit=True)
    except SyntaxError as exc:
        return f"the program does not parse: {exc.msg} (line {exc.lineno})"
    except ValueError as exc:  # e.g. a NUL byte in the text
        return f"the program does not parse: {exc}"
    return None


def prepare(data_dir: Path, files: Iterable[str], name: str, source: str, into: Path) -> None:
    """Copy the tests' files from `data_dir` into `into` and write `source` as the program under test."""
    for relative in files:
        target = into / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(data_dir / relative, target)
    program = into / PROGRAMS / f"{name}.py"
    program.parent.mkdir(parents=True, exist_ok=True)
    program.write_text(source, encoding="utf-8")


def evaluate(
    task: Mapping[str, Any],
    source: str,
    *,
    case_timeout_s: float = CASE_TIMEOUT_S,
    budget_s: float = BUDGET_S,
    memory_mb: int = MEMORY_MB,
    sandbox: agl.Sandbox | str | None = None,
) -> Evaluation:
    """Run the tests of `task` (a `data.load` task input) against `source`, in a fresh folder that is removed."""
    name = str(task["program"])
    result = Evaluation(name, expected_cases=int(task.get("cases") or 0))
    result.error = syntax_error(source, name)
    if result.error is not None:
        return result
    with tempfile.TemporaryDirectory(prefix=f"agl-quixbugs-{name}-") as folder:
        workdir = Path(folder)
        prepare(Path(task["data_dir"]), task["files"], name, source, workdir)
        run_tests(
            workdir, result, case_timeout_s=case_timeout_s, budget_s=budget_s, memory_mb=memory_mb, sandbox=sandbox
        )
    return result


def _kill(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the child and anything it started: its own session
    except ProcessLookupError:
        pass
    process.wait()


def run_tests(
    workdir: Path,
    result: Evaluation,
    *,
    case_timeout_s: float,
    budget_s: float,
    memory_mb: int,
    sandbox: agl.Sandbox | str | None = None,
) -> None:
    """Fill `result.cases` by running `runner.py` in `workdir`, restarting it after a case that never reported."""
    started = time.monotonic()
    budget_end = started + budget_s
    ids: list[str] | None = None
    start = 0
    try:
        while ids is None or start < len(ids):
            if time.monotonic() >= budget_end:
                break
            outcome, message = _run_from(workdir, result, start, case_timeout_s, budget_end, memory_mb, sandbox)
            ids = result.case_ids
            if outcome == "done" or (ids is None and outcome == "import_error"):
                break
            if ids is None:  # the child died or hung before it could list the cases: nothing can run
                result.error = message
                break
            # the case after the last one reported never reported: timed out (killed) or crashed the child
            start = len(result.cases)
            if start < len(ids):
                result.cases.append(CaseResult(ids[start], outcome, message))
                start += 1
                result.restarts += time.monotonic() < budget_end
        if ids is not None:
            for case_id in ids[len(result.cases) :]:
                result.cases.append(CaseResult(case_id, "not_run", f"the program's {budget_s:g} s budget was spent"))
        elif result.error is None:
            result.error = f"the tests did not start within the program's {budget_s:g} s budget"
    finally:
        result.seconds = time.monotonic() - started


def _run_from(
    workdir: Path,
    result: Evaluation,
    start: int,
    case_timeout_s: float,
    budget_end: float,
    memory_mb: int,
    sandbox: agl.Sandbox | str | None,
) -> tuple[str, str]:
    """Run the cases from `start` on in one child; append each reported case to `result.cases`. Returns how the
    child ended: ("done", ""), ("import_error", why), ("timeout", why) when it was killed, ("error", why)."""
    command = [sys.executable, "-I", "-B", str(RUNNER), result.program, str(start), f"{case_timeout_s:g}"]
    command.append(str(memory_mb))
    # the model's program runs in agl's sandbox: only this folder writable, no network, its whole tree killed with
    # it; its error output in a file outside that folder (a link planted there is never read)
    with contextlib.ExitStack() as stack:
        stderr = stack.enter_context(tempfile.TemporaryFile())
        process = stack.enter_context(agl.sandboxed(
            command, cwd=workdir, sandbox=sandbox, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr
        ))  # fmt: skip
        return _read_reports(process, result, stderr, case_timeout_s, budget_end)


def _read_reports(
    process: subprocess.Popen[bytes], result: Evaluation, stderr: Any, case_timeout_s: float, budget_end: float
) -> tuple[str, str]:
    assert process.stdout is not None
    fd = process.stdout.fileno()
    buffer = b""
    wait_until = time.monotonic() + STARTUP_S + case_timeout_s
    ended: tuple[str, str] | None = None
    try:
        while ended is None:
            while b"\n" in buffer and ended is None:
                line, buffer = buffer.split(b"\n", 1)
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    continue  # not the runner's (a program that wrote to the report's descriptor)
                ended = _handle(event, result)
                wait_until = time.monotonic() + case_timeout_s + GRACE_S
            if ended is not None:
                break
            left = min(wait_until, budget_end) - time.monotonic()
            if left <= 0:
                what = "ran past" if wait_until <= budget_end else "was stopped when the budget ran out at"
                ended = ("timeout", f"{what} {case_timeout_s:g} s (the child was killed)")
                break
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, _READ)
            if not chunk:  # the child ended without saying it was done: it crashed
                process.wait()
                stderr.seek(0)
                tail = stderr.read().decode("utf-8", errors="replace").strip()[-300:]
                ended = ("error", f"the test process died (exit {process.returncode}){': ' + tail if tail else ''}")
            buffer += chunk
    finally:
        _kill(process)
        process.stdout.close()
    return ended


def _handle(event: dict[str, Any], result: Evaluation) -> tuple[str, str] | None:
    kind = event.get("event")
    if kind == "cases":
        if result.case_ids is None:
            result.case_ids = [str(i) for i in event["ids"]]
        return None
    if kind == "case":
        ids = result.case_ids or []
        index = int(event["i"])
        case_id = ids[index] if index < len(ids) else str(index)
        result.cases.append(CaseResult(case_id, str(event["status"]), str(event.get("message") or "")))
        return None
    if kind == "import_error":
        result.error = f"the tests cannot import the program: {event.get('message')}"
        return ("import_error", result.error)
    return ("done", "")


def evaluate_many(
    items: Iterable[tuple[Mapping[str, Any], str]], *, workers: int | None = None, **options: Any
) -> list[Evaluation]:
    """`evaluate` each (task, source), `workers` at a time (default: the CPU count); results in input order."""
    pairs = list(items)
    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 2) as pool:
        return list(pool.map(lambda pair: evaluate(pair[0], pair[1], **options), pairs))


def check_versions(
    folder: Path, versions: Sequence[str], *, workers: int | None = None, **options: Any
) -> dict[str, list[Evaluation]]:
    """Every program of `folder` (a `quixbugs/` data folder) in each version, `python_programs` (the defective
    ones) and/or `correct_python_programs`, in one pool (the hanging defective programs overlap the others):
    how the tests of this module check the evaluator."""
    from agl_bench.quixbugs.data import program_names

    tasks = [task_input(folder, name) for name in program_names(folder)]
    pairs = [(t, (folder / v / f"{t['program']}.py").read_text(encoding="utf-8")) for v in versions for t in tasks]
    results = evaluate_many(pairs, workers=workers, **options)
    return {v: results[i * len(tasks) : (i + 1) * len(tasks)] for i, v in enumerate(versions)}


# ------------------------------------------------------------------------------------- the model's answer

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)(?:```|\Z)", re.S)


def extract_code(text: str) -> str:
    """The program in a model's answer: the last fenced block labelled python/py (or unlabelled) that parses,
    else the last fenced block, else the whole text. A block cut off by the token limit (no closing fence) is
    taken up to the end of the text."""
    blocks: list[tuple[str, str]] = [(str(label).lower(), str(body)) for label, body in _FENCE.findall(text)]
    code_blocks = [body for label, body in blocks if label in ("", "python", "py", "python3")]
    for body in reversed(code_blocks):
        if syntax_error(body, "answer") is None:
            return body
    if blocks:
        return (code_blocks or [body for _, body in blocks])[-1]
    return text.strip() + "\n"


def parse_program(text: str) -> str | None:
    """The program in a model's answer when it is Python that parses and defines a function, else None (what
    the AIR rule calls: an answer with no usable program)."""
    code = extract_code(text)
    if not code.strip() or syntax_error(code, "answer") is not None:
        return None
    return code if re.search(r"^\s*def \w+", code, re.M) else None
