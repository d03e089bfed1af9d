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
