"""Each adapter alone, with the newest release of its framework (and of openai), in a fresh environment.

The monorepo's one pinned environment holds all four frameworks together, which holds openai back (crewai
requires openai < 3): it hid that openai 3 sends through httpx2 and broke attribution for every user who installs
the Agents SDK today. This job lives the `pip install agl-<framework>` story instead: for each adapter a new
virtual environment gets agl-core and the adapter as built wheels (not editable), `pip install -U` of the
framework's packages and openai, and the test tools; then the adapter's own test suite runs there.

The coding agents' harnesses (issue #44), pinned for `make test` (examples/coding-agents/), run at their newest
releases too, as one more job ("harnesses"): the npm ones `npm install`ed at @latest into a fresh folder, the pip
ones into a fresh virtual environment, then tests/test_harness_*.py with the main .venv's pytest (agl and its
fixtures live there; `make test` builds it) and each harness's variable (AGL_CLAUDE_CODE, ...) naming the newest
program.

Usage: python .ci/test_newest.py [--only langchain,crewai,harnesses] [--skip harnesses] [--dir .venv-newest]
Prints the versions installed and the test counts per job; exits 1 if any suite failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import venv
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TAIL_LINES = 80  # of a failed job's log, printed


@dataclass(frozen=True)
class Case:
    name: str
    adapter: str  # folder under packages/, with extras in brackets if any
    upgrade: tuple[str, ...]  # installed with `pip install -U`: the framework's packages and openai
    report: tuple[str, ...]  # distributions whose versions the summary shows

    @property
    def folder(self) -> str:
        return self.adapter.split("[")[0]


CASES = (
    Case(
        "langchain",
        "langchain-adapter",
        ("langchain", "langchain-core", "langchain-openai", "langgraph", "openai"),
        ("langchain", "langchain-core", "langchain-openai", "langgraph", "openai", "httpx", "httpx2"),
    ),
    Case(
        "autogen",
        "autogen-adapter[openai]",
        ("autogen-agentchat", "autogen-core", "autogen-ext[openai]", "openai"),
        ("autogen-agentchat", "autogen-core", "autogen-ext", "openai", "httpx", "httpx2"),
    ),
    Case(
        "openai-agents",
        "openai-agents-adapter",
        ("openai-agents", "openai"),
        ("openai-agents", "openai", "httpx", "httpx2"),
    ),
    Case(
        # the litellm extra: CrewAI sends models of providers it has no native client for through LiteLLM
        "crewai",
        "crewai-adapter",
        ("crewai[litellm]", "openai"),
        ("crewai", "litellm", "openai", "httpx", "httpx2"),
    ),
    Case(
        # agl-otel reads spans: the OpenTelemetry SDK, and the frameworks its tests run
        "otel",
        "otel-adapter",
        (
            "opentelemetry-sdk",
            "opentelemetry-api",
            "pydantic-ai-slim[openai]",
            "smolagents",
            "openinference-instrumentation-smolagents",
            "agent-framework-core",
            "agent-framework-openai",
            "openai",
        ),
        (
            "opentelemetry-sdk",
            "pydantic-ai-slim",
            "smolagents",
            "openinference-instrumentation-smolagents",
            "agent-framework-core",
            "openai",
        ),
    ),
    Case(
        # agl-otel's OpenInference frameworks apart (issue #43): their newest releases need not co-install with the
        # native-span frameworks above; each test module skips the frameworks its environment lacks
        "otel-openinference",
        "otel-adapter",
        (
            "opentelemetry-sdk",
            "langchain",
            "langgraph",
            "langchain-openai",
            "openinference-instrumentation-langchain",
            "llama-index-core",
            "llama-index-llms-openai-like",
            "openinference-instrumentation-llama-index",
            "agno",
            "openinference-instrumentation-agno",
            "haystack-ai",
            "openinference-instrumentation-haystack",
            "openai-agents",
            "openinference-instrumentation-openai-agents",
            "openai",
        ),
        (
            "langchain",
            "langgraph",
            "openinference-instrumentation-langchain",
            "llama-index-core",
            "openinference-instrumentation-llama-index",
            "agno",
            "openinference-instrumentation-agno",
            "haystack-ai",
            "openinference-instrumentation-haystack",
            "openai-agents",
            "openinference-instrumentation-openai-agents",
            "openai",
        ),
    ),
    Case(
        # DSPy apart: its newest release and the newest of the frameworks above make pip's resolver backtrack for
        # tens of minutes (measured: more than 20) where each group alone resolves in seconds; BeeAI, which also
        # sends its calls through LiteLLM, resolves with it in seconds (measured: 17 s)
        "otel-dspy",
        "otel-adapter",
        (
            "opentelemetry-sdk",
            "dspy",
            "openinference-instrumentation-dspy",
            "beeai-framework",
            "openinference-instrumentation-beeai",
            "openai",
        ),
        (
            "dspy",
            "openinference-instrumentation-dspy",
            "beeai-framework",
            "openinference-instrumentation-beeai",
            "litellm",
            "openai",
        ),
    ),
    Case(
        # Google ADK apart: it pins an older OpenTelemetry SDK than the exporter agl-core uses with the others
        "otel-adk",
        "otel-adapter",
        ("google-adk", "litellm", "openai"),
        ("google-adk", "litellm", "opentelemetry-sdk", "openai", "httpx"),
    ),
)


@dataclass(frozen=True)
class Harness:
    name: str
    program: str  # the command: node_modules/.bin/<program> (npm) or bin/<program> of the venv (pip)
    env: str  # the variable the example and its test read for the program's path
    test: str  # its test module
    npm: str = ""  # installed as <npm>@latest, in a folder of its own, ...
    pip: tuple[str, ...] = ()  # ... or with `pip install -U` (the program's package first), in a venv of its own
    report: tuple[str, ...] = ()  # for pip harnesses: distributions whose versions the summary shows
    npm_flags: tuple[str, ...] = ()  # more `npm install` flags


HARNESSES = (
    Harness(
        "claude-code", "claude", "AGL_CLAUDE_CODE", "tests/test_harness_claude_code.py", npm="@anthropic-ai/claude-code"
    ),
    Harness("codex", "codex", "AGL_CODEX", "tests/test_harness_codex.py", npm="@openai/codex"),
    # the pinned one is the platform package opencode-ai's postinstall picks (examples/coding-agents/opencode/); the
    # newest is opencode-ai itself, as users install it, its postinstall putting that binary in place
    Harness("opencode", "opencode", "AGL_OPENCODE", "tests/test_harness_opencode.py", npm="opencode-ai"),
    Harness(
        # its model client too (examples/coding-agents/requirements.txt pins both)
        "mini-swe-agent",
        "mini",
        "AGL_MINI_SWE_AGENT",
        "tests/test_harness_mini_swe_agent.py",
        pip=("mini-swe-agent", "litellm", "openai"),
        report=("mini-swe-agent", "litellm", "openai"),
    ),
    # the registry these machines use lacks some of its optional platform packages (clipboard), which it runs without
    Harness(
        "qwen-code",
        "qwen",
        "AGL_QWEN_CODE",
        "tests/test_harness_qwen_code.py",
        npm="@qwen-code/qwen-code",
        npm_flags=("--omit=optional",),
    ),
    # Aider pins every dependency exactly: a venv of its own (as every pip harness here), apart from mini-swe-agent's
    Harness(
        "aider",
        "aider",
        "AGL_AIDER",
        "tests/test_harness_aider.py",
        pip=("aider-chat",),
        report=("aider-chat", "litellm", "openai"),
    ),
)
HARNESS_JOB = "harnesses"


def _test_tools() -> list[str]:
    """The pinned test runner and its plugins, as the main suite uses them."""
    lines = (REPO / "requirements-dev.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip().startswith(("pytest==", "pytest-"))]


def _run(cmd: list[str], log: Path, cwd: Path = REPO, env: dict[str, str] | None = None) -> int:
    with log.open("a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        return subprocess.run(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT).returncode


def _output(cmd: list[str], log: Path) -> str:
    """The command's first line of output (logged whole), or "-" when it fails: `claude --version` and the like."""
    with log.open("a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        try:
            done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            out.write(f"{exc}\n")
            return "-"
        out.write(done.stdout + done.stderr + f"(exit {done.returncode})\n")
    lines = done.stdout.strip().splitlines()
    return lines[0].strip() if done.returncode == 0 and lines else "-"


def _note(log: Path, text: str) -> int:
    """A reason the job fails, in its log; 1."""
    with log.open("a") as out:
        out.write(text + "\n")
    return 1


def _pip_versions(python: str, names: tuple[str, ...]) -> dict[str, str]:
    listed = subprocess.run([python, "-m", "pip", "list", "--format", "json"], capture_output=True, text=True)
    installed = {d["name"].lower(): d["version"] for d in json.loads(listed.stdout or "[]")}
    return {name: installed.get(name, "-") for name in names}


def _counts(junit: Path) -> dict[str, int]:
    if not junit.exists():
        return {}
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")  # type: ignore[assignment]
    if suite is None:
        return {}
    total, failures, errors, skipped = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
    return {"passed": total - failures - errors - skipped, "failed": failures + errors, "skipped": skipped}


def run_case(case: Case, root: Path) -> dict[str, object]:
    env_dir = root / case.name
    shutil.rmtree(env_dir, ignore_errors=True)
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")
    log = root / f"{case.name}.log"
    log.unlink(missing_ok=True)
    t0 = time.monotonic()
    extras = case.adapter[len(case.folder) :]
    # --no-compile: these jobs run beside `make test` in CI, and byte-compiling every installed framework file costs
    # CPU the suite needs; the few modules the tests import compile as they load
    install = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile"]
    rc = _run([*install, "./packages/core", f"./packages/{case.folder}{extras}", *_test_tools()], log)
    if rc == 0:
        rc = _run([*install, "-U", *case.upgrade], log)
    versions = _pip_versions(python, case.report) if rc == 0 else {}
    install_s = time.monotonic() - t0
    junit = root / f"{case.name}.junit.xml"
    junit.unlink(missing_ok=True)
    if rc == 0:
        tests = [python, "-m", "pytest", f"packages/{case.folder}/tests", "-q", "-p", "no:cacheprovider"]
        rc = _run([*tests, f"--junitxml={junit}"], log)
    counts = _counts(junit)
    return {
        "adapter": case.name,
        "ok": rc == 0,
        "versions": versions,
        "tests": counts,
        "install_s": round(install_s),
        "total_s": round(time.monotonic() - t0),
        "log": str(log.relative_to(REPO)) if log.is_relative_to(REPO) else str(log),
    }


def run_harnesses(harnesses: tuple[Harness, ...], root: Path) -> dict[str, object]:
    """The newest release of each coding agent's program, then their tests (tests/test_harness_*.py) with the main
    .venv's pytest, each program named by its variable: the examples and the tests read it before the pinned one."""
    job = root / HARNESS_JOB
    shutil.rmtree(job, ignore_errors=True)
    job.mkdir(parents=True)
    log = root / f"{HARNESS_JOB}.log"
    log.unlink(missing_ok=True)
    t0 = time.monotonic()
    programs: dict[str, str] = {}
    versions: dict[str, str] = {}
    rc = 0
    on_disk = {str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_harness_*.py")}
    harnesses = tuple(h for h in harnesses if h.test in on_disk)  # a harness listed ahead of its test waits for it
    unlisted = sorted(on_disk - {h.test for h in harnesses})
    if unlisted:  # a harness pinned for `make test` must run at its newest here too
        rc = _note(log, f"not in HARNESSES (.ci/test_newest.py), so not run at its newest: {', '.join(unlisted)}")
    pytest_python = REPO / ".venv" / "bin" / "python"
    if rc == 0 and not pytest_python.exists():
        rc = _note(log, f"{pytest_python} is missing: the harness tests run in the main environment (make install)")
    for h in [h for h in harnesses if h.npm] if rc == 0 else []:
        folder = job / f"npm-{h.name}"
        folder.mkdir()
        # a package.json of its own: else npm installs into the nearest folder above that has one
        (folder / "package.json").write_text(json.dumps({"name": "agl-newest-harnesses", "private": True}))
        npm_install = ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error", *h.npm_flags]
        rc = _run([*npm_install, f"{h.npm}@latest"], log, cwd=folder)
        if rc == 0:
            programs[h.env] = str(folder / "node_modules" / ".bin" / h.program)
            # the program must run as installed (Claude Code's postinstall puts its native binary in place)
            versions[h.program] = _output([programs[h.env], "--version"], log)
            rc = int(versions[h.program] == "-")
        if rc:
            break
    for h in [h for h in harnesses if h.pip] if rc == 0 else []:
        env_dir = job / f"venv-{h.name}"
        venv.create(env_dir, with_pip=True)
        python = str(env_dir / "bin" / "python")
        install = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile", "-U"]
        rc = _run([*install, *h.pip], log)
        if rc == 0:
            programs[h.env] = str(env_dir / "bin" / h.program)
            versions.update(_pip_versions(python, h.report))
            rc = _run([programs[h.env], "--help"], log)
            _run([python, "-m", "pip", "show", h.pip[0]], log)
        if rc:
            break
    install_s = time.monotonic() - t0
    junit = root / f"{HARNESS_JOB}.junit.xml"
    junit.unlink(missing_ok=True)
    if rc == 0:
        tests = [str(pytest_python), "-m", "pytest", *(h.test for h in harnesses), "-q", "-p", "no:cacheprovider"]
        rc = _run([*tests, f"--junitxml={junit}"], log, env={**os.environ, **programs})
    return {
        "adapter": HARNESS_JOB,
        "ok": rc == 0,
        "versions": versions,
        "tests": _counts(junit),
        "install_s": round(install_s),
        "total_s": round(time.monotonic() - t0),
        "log": str(log.relative_to(REPO)) if log.is_relative_to(REPO) else str(log),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = [*(c.name for c in CASES), HARNESS_JOB]
    parser.add_argument("--only", default="", help="comma-separated jobs: " + ",".join(names))
    parser.add_argument("--skip", default="", help="comma-separated jobs not to run")
    parser.add_argument("--dir", default=".venv-newest", help="where the environments and logs go")
    parser.add_argument(
        "--jobs", type=int, default=3, help="jobs at a time (CI: 2, beside the suite, whose heavy tests need the CPU)"
    )
    args = parser.parse_args()
    wanted = {n.strip() for n in args.only.split(",") if n.strip()}
    skipped = {n.strip() for n in args.skip.split(",") if n.strip()}
    unknown = (wanted | skipped) - set(names)
    if unknown:
        parser.error(f"unknown job(s): {', '.join(sorted(unknown))}")
    wanted = (wanted or set(names)) - skipped
    root = (REPO / args.dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    chosen = [case for case in CASES if case.name in wanted]
    harnesses = HARNESS_JOB in wanted
    if harnesses:
        newest = ", ".join(h.npm or h.pip[0] for h in HARNESSES)
        print(f"[newest] {HARNESS_JOB}: fresh npm folder and environment, newest {newest} ...", flush=True)
    for case in chosen:
        print(f"[newest] {case.name}: fresh environment, newest {', '.join(case.upgrade)} ...", flush=True)
    # three at a time by default: most of a job is pip downloading and unpacking; the harnesses' job first, so that
    # its tests (real agl serve + workers) overlap the adapters' installs instead of ending last
    jobs = len(chosen) + int(harnesses)
    with ThreadPoolExecutor(max_workers=max(1, min(args.jobs, jobs))) as pool:
        futures = [pool.submit(run_harnesses, HARNESSES, root)] if harnesses else []
        futures += [pool.submit(run_case, case, root) for case in chosen]
        for future in as_completed(futures):
            report(future.result())
    results = [future.result() for future in futures]
    summary = root / "summary.json"  # CI runs the jobs in two calls: each keeps the other's entries
    names_run = {r["adapter"] for r in results}
    earlier = json.loads(summary.read_text()) if summary.exists() else []
    summary.write_text(json.dumps([r for r in earlier if r["adapter"] not in names_run] + results, indent=2))
    failed = [r for r in results if not r["ok"]]
    for result in failed:
        print_tail(REPO / str(result["log"]))
    if failed:
        print(
            f"[newest] FAILED: {', '.join(str(r['adapter']) for r in failed)}; their logs' ends above", file=sys.stderr
        )
        return 1
    return 0


def print_tail(log: Path, lines: int = TAIL_LINES) -> None:
    """The end of a failed job's log: CI keeps only what this prints, not the log files (stop 49's CI named the
    failed job and left no way to see which test failed)."""
    text = log.read_text(errors="replace").splitlines() if log.exists() else [f"(no log at {log})"]
    print(f"[newest] ---- the last {min(lines, len(text))} lines of {log.name} ----", flush=True)
    print("\n".join(text[-lines:]), flush=True)


def report(result: dict[str, Any]) -> None:
    versions = ", ".join(f"{k} {v}" for k, v in result["versions"].items())
    tests = ", ".join(f"{k} {v}" for k, v in result["tests"].items()) or "no test report"
    print(
        f"[newest] {result['adapter']}: {'ok' if result['ok'] else 'FAILED'} · {tests} · {versions} · "
        f"{result['total_s']} s (log {result['log']})",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
