"""The QuixBugs evaluator: the programs' own tests in a fresh copy, a child process, each case under a time limit;
and reading the program out of a model's answer."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from agl_bench.datasets import datasets_root
from agl_bench.quixbugs.data import CORRECT, PROGRAMS, task_input
from agl_bench.quixbugs.evaluate import (
    BUDGET_S,
    CASE_TIMEOUT_S,
    check_versions,
    evaluate,
    evaluate_many,
    extract_code,
    parse_program,
)


@pytest.fixture(scope="module")
def folder() -> Path:
    # DataError names the folders looked in and says to run `agl bench data fetch quixbugs` when there is none
    return datasets_root(None, "quixbugs") / "quixbugs"


def _task(folder: Path, name: str) -> dict[str, Any]:
    return task_input(folder, name)


def _snapshot(folder: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in folder.rglob("*")}


@pytest.mark.slow
def test_every_corrected_program_scores_1_and_every_defective_one_less(folder: Path) -> None:
    before = _snapshot(folder)
    # the corrected programs with 4x the default time per case: what is checked is that each scores exactly 1, and
    # the slowest (levenshtein, ~2.2 s alone) ran past 6 s beside the rest of the suite on a slow day
    correct = check_versions(folder, [CORRECT], case_timeout_s=4 * CASE_TIMEOUT_S, budget_s=4 * BUDGET_S)[CORRECT]
    defective = check_versions(folder, [PROGRAMS])[PROGRAMS]
    assert len(correct) == len(defective) == 40
    assert {r.program: r.reward for r in correct if r.reward != 1.0} == {}
    assert [r.program for r in defective if r.reward >= 1.0 or r.error] == []
    assert sum(r.total for r in correct) == 276  # as `pytest --correct python_testcases`: 276 passed, 2 skipped
    assert sum(r.skipped for r in correct) == 2
    by_name = {r.program: r for r in defective}
    # bitcount loops forever on every input: stopped case by case, then its budget ends the program
    assert by_name["bitcount"].timed_out >= 2 and by_name["bitcount"].passed == 0
    assert by_name["bitcount"].seconds < 25
    assert by_name["quicksort"].summary()["failures"][0]["status"] == "failed"
    assert _snapshot(folder) == before, "the shared data is never written to"


def test_a_program_that_does_not_parse_scores_0_and_says_why(folder: Path) -> None:
    result = evaluate(_task(folder, "gcd"), "def gcd(a, b):\n    return gcd(b, a % b\n")
    assert result.reward == 0.0 and result.total == 6 and result.cases == []
    assert result.error is not None and result.error.startswith("the program does not parse: ")
    assert "line 2" in result.error
    assert result.summary()["error"] == result.error


def test_tests_that_cannot_import_the_program_score_0(folder: Path) -> None:
    result = evaluate(_task(folder, "gcd"), "def greatest(a, b):\n    return a\n")
    assert result.reward == 0.0 and result.total == 6
    assert result.error is not None and "cannot import name 'gcd'" in result.error


def test_each_case_counts_and_the_program_runs_in_a_fresh_folder(folder: Path) -> None:
    # right for even inputs only; writes into its working folder, which is a temporary copy
    source = (
        "import os\n"
        "def gcd(a, b):\n"
        "    open('written-by-the-program.txt', 'w').write(os.getcwd())\n"
        "    import math\n"
        "    return math.gcd(a, b) if a % 2 == 0 else -1\n"
    )
    result = evaluate(_task(folder, "gcd"), source)
    assert 0 < result.passed < result.total == 6
    assert result.reward == pytest.approx(result.passed / 6)
    assert {c.status for c in result.cases} == {"passed", "failed"}
    assert not list(folder.rglob("written-by-the-program.txt"))


def test_a_case_that_ignores_its_alarm_is_killed_and_the_next_cases_still_run(folder: Path) -> None:
    # a bare `except:` swallows the alarm: the parent kills the child and starts a new one after that case
    source = (
        "def bitcount(n):\n"
        "    if n == 13:\n"
        "        while True:\n"
        "            try:\n"
        "                while True:\n"
        "                    pass\n"
        "            except BaseException:\n"
        "                pass\n"
        "    return bin(n).count('1')\n"
    )
    started = time.monotonic()
    result = evaluate(_task(folder, "bitcount"), source, case_timeout_s=0.5)
    assert time.monotonic() - started < 8
    assert result.timed_out == 1 and result.passed == 8 and result.restarts == 1
    (slow,) = [c for c in result.cases if c.status == "timeout"]
    assert slow.id == "test_bitcount[3]" and "killed" in slow.message


def test_a_program_past_its_budget_has_its_remaining_cases_not_run(folder: Path) -> None:
    source = "def bitcount(n):\n    while True:\n        pass\n"
    result = evaluate(_task(folder, "bitcount"), source, case_timeout_s=0.5, budget_s=2.5)
    # how many cases time out before the budget ends depends on the machine's load: at least one, not all
    assert result.passed == 0 and result.total == 9 and 1 <= result.timed_out <= 6
    assert result.count("not_run") == 9 - result.timed_out
    assert result.seconds < 5


def test_a_crash_of_the_test_process_is_an_error_of_that_case(folder: Path) -> None:
    source = (
        "import os\ndef gcd(a, b):\n    if a == 17:\n        os._exit(3)\n    import math\n    return math.gcd(a, b)\n"
    )
    result = evaluate(_task(folder, "gcd"), source)
    crashed = [c for c in result.cases if c.status == "error"]
    assert len(crashed) == 1 and "died (exit 3)" in crashed[0].message
    assert result.passed == 5 and result.restarts == 1


def test_many_programs_at_once_keep_their_order(folder: Path) -> None:
    names = ["gcd", "sqrt", "wrap"]
    tasks = [_task(folder, n) for n in names]
    sources = [(folder / CORRECT / f"{n}.py").read_text() for n in names]
    results = evaluate_many(zip(tasks, sources, strict=True), workers=os.cpu_count())
    assert [(r.program, r.reward) for r in results] == [(n, 1.0) for n in names]


def test_extract_code_from_a_model_answer() -> None:
    block = "def f(x):\n    return x + 1\n"
    assert extract_code(f"Here it is:\n```python\n{block}```\nDone.") == block
    assert extract_code(f"```py\n{block}```") == block
    # the last block that parses wins over a later broken one and an earlier one
    assert extract_code(f"```python\ndef g(): pass\n```\n```python\n{block}```\n```python\ndef (\n```") == block
    assert extract_code(f"```python\n{block}") == block  # cut by the token limit
    assert extract_code("```text\nnot code\n```") == "not code\n"
    assert extract_code(block) == block  # no fence: the whole text
    assert parse_program(f"```python\n{block}```") == block
    assert parse_program("I cannot help with that.") is None
    assert parse_program("```python\nx = 1\n```") is None  # no function: nothing the tests could call
