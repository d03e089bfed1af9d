"""Each adapter alone, with the newest release of its framework (and of openai), in a fresh environment.

The monorepo's one pinned environment holds all four frameworks together, which holds openai back (crewai
requires openai < 3): it hid that openai 3 sends through httpx2 and broke attribution for every user who installs
the Agents SDK today. This job lives the `pip install agl-<framework>` story instead: for each adapter a new
virtual environment gets agl-core and the adapter as built wheels (not editable), `pip install -U` of the
framework's packages and openai, and the test tools; then the adapter's own test suite runs there.

Usage: python .ci/test_newest.py [--only langchain,crewai] [--dir .venv-newest]
Prints the versions installed and the test counts per adapter; exits 1 if any suite failed.
"""

from __future__ import annotations

import argparse
import json
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
        # tens of minutes (measured: more than 20) where each group alone resolves in seconds
        "otel-dspy",
        "otel-adapter",
        ("opentelemetry-sdk", "dspy", "openinference-instrumentation-dspy", "openai"),
        ("dspy", "openinference-instrumentation-dspy", "litellm", "openai"),
    ),
    Case(
        # Google ADK apart: it pins an older OpenTelemetry SDK than the exporter agl-core uses with the others
        "otel-adk",
        "otel-adapter",
        ("google-adk", "litellm", "openai"),
        ("google-adk", "litellm", "opentelemetry-sdk", "openai", "httpx"),
    ),
)


def _test_tools() -> list[str]:
    """The pinned test runner and its plugins, as the main suite uses them."""
    lines = (REPO / "requirements-dev.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip().startswith(("pytest==", "pytest-"))]


def _run(cmd: list[str], log: Path) -> int:
    with log.open("a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        return subprocess.run(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT).returncode


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
    install = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    rc = _run([*install, "./packages/core", f"./packages/{case.folder}{extras}", *_test_tools()], log)
    if rc == 0:
        rc = _run([*install, "-U", *case.upgrade], log)
    versions: dict[str, str] = {}
    if rc == 0:
        listed = subprocess.run([python, "-m", "pip", "list", "--format", "json"], capture_output=True, text=True)
        installed = {d["name"].lower(): d["version"] for d in json.loads(listed.stdout or "[]")}
        versions = {name: installed.get(name, "-") for name in case.report}
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated adapters: " + ",".join(c.name for c in CASES))
    parser.add_argument("--dir", default=".venv-newest", help="where the environments and logs go")
    args = parser.parse_args()
    wanted = {n.strip() for n in args.only.split(",") if n.strip()}
    unknown = wanted - {c.name for c in CASES}
    if unknown:
        parser.error(f"unknown adapter(s): {', '.join(sorted(unknown))}")
    root = (REPO / args.dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    chosen = [case for case in CASES if not wanted or case.name in wanted]
    for case in chosen:
        print(f"[newest] {case.name}: fresh environment, newest {', '.join(case.upgrade)} ...", flush=True)
    # three at a time: most of a job is pip downloading and unpacking, and CI's time is bounded
    with ThreadPoolExecutor(max_workers=min(3, len(chosen) or 1)) as pool:
        futures = {pool.submit(run_case, case, root): case for case in chosen}
        for future in as_completed(futures):
            report(future.result())
    results = [future.result() for future in futures]
    (root / "summary.json").write_text(json.dumps(results, indent=2))
    failed = [r["adapter"] for r in results if not r["ok"]]
    if failed:
        print(f"[newest] FAILED: {', '.join(map(str, failed))}; see the logs above", file=sys.stderr)
        return 1
    return 0


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
