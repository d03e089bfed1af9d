"""agl-core builds a wheel on its own, the wheel installs into a clean virtual environment with its declared
dependencies, and the installed `agl` serves a proxied call: the `pip install agl-core` story, tested."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import httpx
import pytest

from agl.common.processes import read_ready_line

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
# Nothing that belongs to the trainer or the adapters may leak into core's dependencies.
FORBIDDEN = ("torch", "transformers", "langchain", "langgraph", "autogen", "crewai", "openai-agents", "verl", "vllm")


def run(*args: str | Path, timeout: float = 600) -> str:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_core_wheel_installs_cleanly_and_serves(tmp_path: Path, upstream: str) -> None:
    dist = tmp_path / "dist"
    run(sys.executable, "-m", "build", "--wheel", "--outdir", dist, REPO / "packages" / "core")
    (wheel,) = dist.glob("agl_core-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        metadata = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "agl/testing/upstream.py" in names and "agl/server/proxy.py" in names
    requires = [
        line.split(":", 1)[1].strip().lower() for line in metadata.splitlines() if line.startswith("Requires-Dist:")
    ]
    assert requires and not [r for r in requires if r.startswith(FORBIDDEN)], requires

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    run(python, "-m", "pip", "install", "-q", wheel)
    assert "agl-core" in run(python, "-m", "pip", "list")
    assert "serve" in run(env_dir / "bin" / "agl", "--help")

    proc = subprocess.Popen(
        [env_dir / "bin" / "agl", "serve", f"--run-dir={tmp_path / 'run'}", "--port=0", f"--upstream={upstream}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        url = read_ready_line(proc, "AGL_SERVER_READY", 60)
        httpx.post(f"{url}/api/v1/rollouts", json={"task": {"input": "x"}}).raise_for_status()
        (claim,) = httpx.post(f"{url}/api/v1/claims", json={"worker_id": "w"}).json()
        ids = f"rollout/{claim['rollout']['id']}/attempt/{claim['attempt']['id']}"
        answer = httpx.post(f"{url}/{ids}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert answer.json()["choices"][0]["message"]["content"] == "Echo: hi"
        detail = httpx.get(f"{url}/api/v1/rollouts/{claim['rollout']['id']}/detail").json()
        (call,) = detail["llm_calls"]
        assert call["prompt_ids"] and call["trainable"]
    finally:
        proc.terminate()
        proc.wait(15)
