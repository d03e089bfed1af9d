"""The `pip install agl-langchain` story (and the three others), tested: each adapter and agl-core build their
own wheels; the wheels install into one clean virtual environment beside the pinned frameworks; from there,
each adapter's example app runs a rollout in a real `agl worker` against `agl serve` and the scripted upstream,
and the stored calls carry the framework's own agent names.

For speed: the wheels build in parallel; the clean environment is made without pip and filled by this
environment's pip (`pip --python`, no byte-compiling); the example apps run two at a time, each against its own
`agl serve` (one queue per server, so no worker claims another app's rollout)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import venv
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from agl.client import Client
from agl.common.processes import start_server, stop_processes
from agl.testing.fixtures import wait_rollouts

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
PACKAGES = REPO / "packages"


def _support(adapter: str, module: str) -> Any:
    """A constant from an adapter's own test helpers (the scripted prompts its tests use)."""
    path = PACKAGES / adapter / "tests" / f"{module}.py"
    spec = importlib.util.spec_from_file_location(f"_pkg_{module}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(path.parent))
    return mod


# adapter directory, distribution, import name, example app, task (from the adapter's tests), agents expected
def _cases() -> list[tuple[str, str, str, str, Any, set[str]]]:
    return [
        (
            "langchain-adapter",
            "agl_langchain",
            "agl_langchain",
            "writer_checker_rewriter.py:write_essay",
            _support("langchain-adapter", "lc_support").TASK,
            {"writer", "checker", "rewriter"},
        ),
        (
            "openai-agents-adapter",
            "agl_openai_agents",
            "agl_openai_agents",
            "triage_handoff.py:solve",
            _support("openai-agents-adapter", "openai_agents_support").TASK,
            {"triage", "math"},
        ),
        (
            "autogen-adapter",
            "agl_autogen",
            "agl_autogen",
            "calculator_team.py:solve",
            {"question": "What is 12+30?", "answer": 42, **_support("autogen-adapter", "test_autogen_worker").SCRIPT},
            {"solver", "verifier"},
        ),
        (
            "crewai-adapter",
            "agl_crewai",
            "agl_crewai",
            "research_crew.py:research_crew",
            {"question": "What is 12 + 30?", "answer": 42},
            {"Researcher", "Writer"},
        ),
        (
            "otel-adapter",
            "agl_otel",
            "agl_otel",
            "pydantic_ai_delegation.py:solve",
            {"question": "What is 12 * 7?", "answer": 84},
            {"planner", "solver"},
        ),
    ]


def run(*args: str | Path, timeout: float = 900) -> str:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def build_wheel(package: str, outdir: Path) -> Path:
    run(sys.executable, "-m", "build", "--wheel", "--outdir", outdir, PACKAGES / package)
    (wheel,) = outdir.glob("*.whl")
    return wheel


def run_example(
    tmp_path: Path, upstream: str, env_dir: Path, directory: str, app: str, task: Any, agents: set[str]
) -> None:
    """One adapter's example app in the clean environment's own `agl worker`, against an `agl serve` of its own."""
    home = tmp_path / f"home-{directory}"
    home.mkdir()
    server = start_server(tmp_path / f"run-{directory}", upstream=upstream)
    env = {
        "PATH": f"{env_dir / 'bin'}:{os.environ.get('PATH', '')}",
        "CREWAI_DISABLE_TELEMETRY": "true",
        "CREWAI_TRACING_ENABLED": "false",
        "HOME": str(home),  # frameworks that write settings under ~ write them here
    }
    log = tmp_path / f"{directory}.log"
    worker = None
    try:
        with Client(server.url) as client, open(log, "wb") as out:
            # the worker is the clean environment's own `agl` (its interpreter, its installed wheels)
            worker = subprocess.Popen(
                [
                    env_dir / "bin" / "agl",
                    "worker",
                    str(PACKAGES / directory / "examples" / app),
                    f"--server={server.url}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **env},
                cwd=tmp_path,
            )
            (rollout,) = client.enqueue(task)
            (done,) = wait_rollouts(client, [rollout.id], timeout=180)
            assert done.status.value == "succeeded", (directory, done.error, log.read_text()[-3000:])
            detail = client.rollout_detail(rollout.id)
            named = {c.agent_name for c in detail.llm_calls}
            assert named == agents, (directory, named)
            assert all(c.attribution.value == "scope" and c.trainable for c in detail.llm_calls), directory
    finally:
        stop_processes([worker], grace_s=30)
        server.stop()


def test_adapter_wheels_install_beside_the_frameworks_and_attribute_calls(tmp_path: Path, upstream: str) -> None:
    cases = _cases()
    packages = ["core", *(directory for directory, *_ in cases)]
    with ThreadPoolExecutor(3) as pool:
        built = list(pool.map(lambda package: build_wheel(package, tmp_path / "dist" / package), packages))
    assert built[0].name.startswith("agl_core-"), built[0]
    wheels = [built[0]]
    for (_, dist_name, import_name, *_), wheel in zip(cases, built[1:], strict=True):
        assert wheel.name.startswith(f"{dist_name}-"), wheel
        with zipfile.ZipFile(wheel) as zf:
            names = zf.namelist()
            metadata = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        assert f"{import_name}/__init__.py" in names
        requires = [
            line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")
        ]
        assert any(r.startswith("agl-core") for r in requires), requires
        assert not [r for r in requires if r.startswith(("torch", "agl-trainer"))], requires
        wheels.append(wheel)

    # a clean environment without pip of its own, filled by this environment's pip
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    pip = (sys.executable, "-m", "pip", "--python", python)
    run(*pip, "install", "-q", "--no-compile", *wheels, "-r", REPO / "requirements-adapters.txt")
    run(*pip, "check")
    run(python, "-c", "import agl_langchain, agl_autogen, agl_openai_agents, agl_crewai, agl_otel, agl")

    with ThreadPoolExecutor(2) as pool:
        runs = [
            pool.submit(run_example, tmp_path, upstream, env_dir, directory, app, task, agents)
            for directory, _, _, app, task, agents in cases
        ]
        for done in runs:
            done.result()
