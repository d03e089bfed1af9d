"""Runs one QuixBugs program's test cases inside a child process and reports each case as a JSON line.

Started by `evaluate.run_tests` as `python -I runner.py NAME START CASE_TIMEOUT_S MEMORY_MB` with the working
directory a fresh copy of the files the tests need (`python_programs/NAME.py`, `python_testcases/...`,
`json_testcases/NAME.json`). It imports the repository's own pytest module `test_NAME` with `pytest.use_correct`
False (so `python_programs/NAME.py`, the program under test, is what the tests import) and `pytest.run_slow` False
(the two cases the repository skips as minutes long stay skipped), then calls each test function, once per
`@pytest.mark.parametrize` row, from case START on. Calling the functions directly instead of running pytest keeps
one program's check at about a third of a second: pytest's collection would cost more than the tests.

Each case runs under `signal.setitimer`: past CASE_TIMEOUT_S it raises `CaseTimeout`, a BaseException so that a
program's own `except Exception` cannot swallow it. What the alarm cannot stop (a loop in C code, a bare
`except:`) the parent stops: it kills this process group when a case reports nothing in time, and starts again
after that case. The address space is capped at MEMORY_MB so a program that grows a list forever fails with
MemoryError instead of taking the machine's memory.

Protocol on stdout, one JSON object a line: `{"event": "cases", "ids": [...]}` once the tests are imported, or
`{"event": "import_error", "message": ...}`; then `{"event": "case", "i", "status", "message"}` per case (status
`passed`, `failed`, `error`, `timeout` or `skipped`); then `{"event": "done"}`. What the program prints goes to
/dev/null. This file imports nothing of agl: it runs with the interpreter's isolated mode (`-I`).
"""

from __future__ import annotations

import importlib
import json
import os
import resource
import signal
import sys
import traceback
from collections.abc import Callable
from typing import Any, TextIO

MESSAGE_CHARS = 300


class CaseTimeout(BaseException):
    """A case ran past its time limit (BaseException: `except Exception` in the program must not catch it)."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise CaseTimeout()


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text[:MESSAGE_CHARS]


def _where(exc: BaseException) -> str:
    """The exception and the last line of the program or test it came from (not this runner's frames)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.endswith("runner.py")]
    if not frames:
        return _short(exc)
    last = frames[-1]
    return f"{_short(exc)} ({os.path.basename(last.filename)}:{last.lineno})"[:MESSAGE_CHARS]


def collect(module: Any) -> list[tuple[str, Callable[..., Any], dict[str, Any]]]:
    """(case id, test function, keyword arguments) of every case, in the order the file defines them."""
    cases: list[tuple[str, Callable[..., Any], dict[str, Any]]] = []
    for name, value in vars(module).items():
        if not name.startswith("test") or not callable(value) or getattr(value, "__module__", None) != module.__name__:
            continue
        marks = [m for m in getattr(value, "pytestmark", []) if getattr(m, "name", "") == "parametrize"]
        if not marks:
            cases.append((name, value, {}))
            continue
        argnames, rows = marks[0].args[0], marks[0].args[1]
        names = [a.strip() for a in argnames.split(",")] if isinstance(argnames, str) else list(argnames)
        for index, row in enumerate(rows):
            values = row if len(names) > 1 else (row,)
            cases.append((f"{name}[{index}]", value, dict(zip(names, values, strict=True))))
    return cases


def run_case(function: Callable[..., Any], kwargs: dict[str, Any], timeout_s: float, skip: type) -> tuple[str, str]:
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        function(**kwargs)
    except CaseTimeout:
        return "timeout", f"ran past {timeout_s:g} s"
    except AssertionError as exc:
        return "failed", _where(exc)
    except BaseException as exc:  # the program's own errors, and pytest.skip's Skipped (a BaseException)
        if isinstance(exc, skip):
            return "skipped", _short(exc)
        return "error", _where(exc)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return "passed", ""


def emit(out: TextIO, **event: Any) -> None:
    out.write(json.dumps(event, default=str) + "\n")
    out.flush()


def main(argv: list[str]) -> int:
    name, start, timeout_s, memory_mb = argv[0], int(argv[1]), float(argv[2]), int(argv[3])
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")  # the report; fd 1 itself goes to /dev/null below
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    sys.stdout = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 (kept open for the whole run)
    if memory_mb > 0:
        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    here = os.getcwd()
    sys.path[:0] = [os.path.join(here, "python_testcases"), here]
    signal.signal(signal.SIGALRM, _on_alarm)
    import pytest

    pytest.use_correct = False  # type: ignore[attr-defined]
    pytest.run_slow = False  # type: ignore[attr-defined]
    signal.setitimer(signal.ITIMER_REAL, timeout_s)  # a program whose import never ends
    try:
        module = importlib.import_module(f"test_{name}")
        cases = collect(module)
    except BaseException as exc:  # SyntaxError, NameError, a timeout at import: every case fails
        signal.setitimer(signal.ITIMER_REAL, 0)
        message = f"import ran past {timeout_s:g} s" if isinstance(exc, CaseTimeout) else _where(exc)
        emit(out, event="import_error", message=message)
        return 0
    signal.setitimer(signal.ITIMER_REAL, 0)
    emit(out, event="cases", ids=[case_id for case_id, _, _ in cases])
    skip = pytest.skip.Exception
    for index in range(start, len(cases)):
        _, function, kwargs = cases[index]
        status, message = run_case(function, kwargs, timeout_s, skip)
        emit(out, event="case", i=index, status=status, message=message)
    emit(out, event="done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
