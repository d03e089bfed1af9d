"""Suite-wide check for `make test`: in the environment the Makefile builds, every framework a test needs is
installed, so a test skipped for any reason not listed in AGL_ALLOWED_SKIPS (substrings, `|`-separated) fails the
run. Without it, a pin that stops a framework from installing (or from importing) turns its tests into silent skips
and CI stays green while covering less (this happened: a fresh environment skipped two adapters' tests)."""

from __future__ import annotations

import os

import pytest

_unexpected: list[str] = []


def _allowed() -> list[str] | None:
    value = os.environ.get("AGL_ALLOWED_SKIPS")
    return None if value is None else [part for part in value.split("|") if part]


def _note_skip(report: pytest.CollectReport | pytest.TestReport) -> None:
    allowed = _allowed()
    if allowed is None or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if not any(part in reason for part in allowed):
        _unexpected.append(f"{report.nodeid}: {reason}")


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _note_skip(report)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _note_skip(report)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _unexpected and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _unexpected:
        terminalreporter.section("skips not allowed under AGL_ALLOWED_SKIPS", sep="=", red=True)
        for line in _unexpected:
            terminalreporter.line(line)


# The modules that took longest on 2026-11-28 (make test on two processes, seconds in all: vLLM ~950, the main job's
# memory ~600 before it was cut to one step, the API fuzz ~400, the bundled model ~300, the plan's memory parts
# ~250, the QuixBugs harness ~140, the adapter wheels ~130), longest first.
LONGEST = (
    "tests/test_vllm_engine.py",
    "tests/test_main_job_memory.py",
    "tests/test_api_fuzz.py",
    "tests/test_train_bundled.py",
    "packages/trainer/tests/test_plan_parts.py",
    "benchmarks/tests/test_quixbugs_harness.py",
    "tests/test_adapter_packaging.py",
)


LONGEST_TIMEOUT_S = 1500


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest modules first, then the other modules holding a slow test, then the rest (each keeping its
    order). `make test` hands modules to its two processes in this order (pytest-xdist, --dist loadscope
    --no-loadscope-reorder): started last, a long module would keep one process busy while the other waits."""
    slow = {_module(item) for item in items if item.get_closest_marker("slow")}

    def rank(item: pytest.Item) -> int:
        module = _module(item)
        return LONGEST.index(module) if module in LONGEST else len(LONGEST) + (0 if module in slow else 1)

    items.sort(key=rank)
    # and 1,500 s each instead of the suite's 600: beside each other and the newest-release jobs in CI, on a slow day,
    # they ran 2-3x their time alone (the vLLM run's fixture and the main job's step went past 600 s on 2026-11-28)
    for item in items:
        if _module(item) in LONGEST and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(LONGEST_TIMEOUT_S))
