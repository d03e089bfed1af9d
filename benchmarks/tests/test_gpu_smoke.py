"""benchmarks/gpu/smoke.sh cannot pass by skipping: a stage chosen whose needs are missing (verl, vLLM) fails the
run and is named, unless AGL_SMOKE_ALLOW_SKIP names it; the vLLM stage looks for vLLM in the Python that runs agl
too (a GPU machine with vLLM installed has no .venv-vllm).

Run on this CPU (AGL_SMOKE_DEVICE=cpu) with this checkout's Python, verl hidden from it by a package on PYTHONPATH
that refuses to import, so that no stage gets as far as a model: a few seconds each.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

GPU = Path(__file__).resolve().parents[1] / "gpu"
ROOT = GPU.parents[1]


def _hide_verl(folder: Path) -> Path:
    """A `verl` package that fails to import, first on PYTHONPATH: the environment of a broken bundle."""
    (folder / "verl").mkdir(parents=True)
    (folder / "verl" / "__init__.py").write_text('raise ImportError("verl hidden by test_gpu_smoke")\n')
    return folder


def _smoke(
    tmp: Path, stages: str, script: Path = GPU / "smoke.sh", path: tuple[Path, ...] = (), **env: str
) -> subprocess.CompletedProcess:
    shadow = _hide_verl(tmp / "shadow")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AGL_", "PYTHON"))}
    return subprocess.run(
        ["bash", str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp,
        env={
            **base,
            "PYTHONPATH": os.pathsep.join(map(str, (shadow, *path))),
            "AGL_SMOKE_DEVICE": "cpu",
            "AGL_SMOKE_PYTHON": sys.executable,
            "AGL_SMOKE_STAGES": stages,
            "AGL_SMOKE_BUNDLE_TARGET": str(tmp / "no-bundle"),  # not a bundle some other run installed
            "AGL_CACHE_DIR": str(tmp / "cache"),
            "TMPDIR": str(tmp),
            **env,
        },
    )


def _tail(done: subprocess.CompletedProcess) -> str:
    return (done.stdout + done.stderr)[-4000:]


def test_a_stage_skipped_for_want_of_verl_fails_the_run_and_is_named(tmp_path: Path) -> None:
    done = _smoke(tmp_path, "verl-update")
    out = done.stdout + done.stderr
    assert done.returncode != 0, _tail(done)
    assert "FAIL: stage verl-update skipped: verl does not import" in out, _tail(done)
    assert "verl hidden by test_gpu_smoke" in out  # the cause, from the import itself
    # the last lines say it again, after the summary
    assert out.rstrip().splitlines()[-1].startswith("FAIL: stage verl-update skipped"), _tail(done)


def test_an_allowed_skip_passes_and_is_named(tmp_path: Path) -> None:
    done = _smoke(tmp_path, "verl-update", AGL_SMOKE_ALLOW_SKIP="vllm,verl-update")
    assert done.returncode == 0, _tail(done)
    assert "stage verl-update skipped (allowed by AGL_SMOKE_ALLOW_SKIP): verl does not import" in done.stdout
    assert "FAIL" not in done.stdout


def test_the_vllm_stage_without_vllm_fails_the_run_and_is_named(tmp_path: Path) -> None:
    done = _smoke(tmp_path, "vllm", AGL_VLLM_PYTHON=sys.executable)  # this Python has no vLLM
    assert done.returncode != 0, _tail(done)
    assert f"FAIL: stage vllm skipped: vLLM does not import with {sys.executable}" in done.stdout, _tail(done)
    done = _smoke(tmp_path / "again", "vllm", AGL_VLLM_PYTHON=sys.executable, AGL_SMOKE_ALLOW_SKIP="vllm")
    assert done.returncode == 0, _tail(done)
    assert "stage vllm skipped (allowed by AGL_SMOKE_ALLOW_SKIP): vLLM does not import" in done.stdout


def test_the_vllm_stage_finds_vllm_in_the_python_that_runs_agl(tmp_path: Path) -> None:
    """No AGL_VLLM_PYTHON and no .venv-vllm (a GPU machine with vLLM installed): the stage looks in the Python
    that runs agl, where a `vllm` now imports, and goes on to verl (hidden here), which it names."""
    checkout = tmp_path / "checkout"  # smoke.sh looks for .venv-vllm in the checkout it is in: one without
    (checkout / "benchmarks").mkdir(parents=True)
    shutil.copytree(GPU, checkout / "benchmarks" / "gpu", ignore=shutil.ignore_patterns("verl-bundle"))
    os.symlink(ROOT / "packages", checkout / "packages")
    fake = tmp_path / "fake"
    (fake / "vllm").mkdir(parents=True)
    (fake / "vllm" / "__init__.py").write_text('__version__ = "0.0-test"\n')
    script = checkout / "benchmarks" / "gpu" / "smoke.sh"
    done = _smoke(tmp_path / "without", "vllm", script=script)
    assert done.returncode != 0, _tail(done)
    assert f"FAIL: stage vllm skipped: vLLM does not import with {sys.executable}" in done.stdout, _tail(done)
    done = _smoke(tmp_path / "with", "vllm", script=script, path=(fake,))
    assert done.returncode != 0, _tail(done)
    assert "FAIL: stage vllm skipped: verl does not import" in done.stdout, _tail(done)


def test_an_unknown_stage_is_refused(tmp_path: Path) -> None:
    done = _smoke(tmp_path, "verl-update", AGL_SMOKE_ALLOW_SKIP="vlm")
    assert done.returncode == 2 and "unknown stage vlm" in done.stderr


@pytest.mark.parametrize("stages", ["metrics"])
def test_metrics_without_train_is_a_skip(tmp_path: Path, stages: str) -> None:
    done = _smoke(tmp_path, stages)
    assert done.returncode != 0 and "FAIL: stage metrics skipped" in done.stdout, _tail(done)
