"""The environments `make gpu` builds on a CUDA machine, resolved from this CPU machine against the package index
without installing anything (pip's `install --dry-run --report`, for Python 3.12 on Linux x86_64, wheels only):

- the trainer's (.venv-gpu): agl-core, agl-trainer[verl] and requirements-gpu.txt resolve to torch 2.11 (the CUDA
  13.0 build), transformers, verl and ray as pinned, every requirement verl 0.9.1 declares is met, and the pins are
  the ones verl's own GPU extras declare; the flash-attn wheel of requirements-gpu-flash-attn.txt (a GitHub release,
  which this machine cannot reach) is checked by its name: the version verl pins, built for that torch and Python;
- vLLM's (.venv-vllm): requirements-gpu-vllm.txt resolves to vllm 0.32.0 on torch 2.13.0.

pip reads each wheel's metadata alone: from the index's PEP 658 files where it lists them, else with HTTP range
requests (`--use-feature=fast-deps`), never whole wheels (measured on this project's machines, whose index lists no
PEP 658 files: both sets in 60-80 s and ~0.4 GB without pip's cache; torch 2.11's wheel with its CUDA wheels alone
are 2.7 GB). The machine's pip configuration files are not read (they may add local wheel folders or indexes, e.g.
CPU builds of torch); PIP_INDEX_URL, PIP_CERT and proxies still apply. Without the index the test fails, saying what
it needed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
TRAINER = REPO / "requirements-gpu.txt"
FLASH_ATTN = REPO / "requirements-gpu-flash-attn.txt"
VLLM = REPO / "requirements-gpu-vllm.txt"
# what `make gpu` installs into .venv-gpu, before the flash-attn wheel (the Makefile says the same, checked below)
TRAINER_ARGS = ["-e", "packages/core", "-e", "packages/trainer[verl]", "-r", "requirements-gpu.txt"]
PYTHON = "3.12"  # .venv-gpu's (the flash-attn wheel is cp312)
# the wheels a Linux x86_64 host with glibc 2.35 (Ubuntu 22.04) installs: pip does not widen a --platform itself
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(35, 4, -1)]
PLATFORMS += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]
# on PyPI as source archives only, which a resolution for another machine (wheels only) cannot use: built into
# wheels here first (pure Python, a second)
SOURCE_ONLY = ["antlr4-python3-runtime==4.9.3"]
NETWORK_ERRORS = re.compile(
    r"NewConnectionError|Max retries exceeded|Temporary failure in name resolution|Name or service not known|"
    r"Network is unreachable|Connection refused|ConnectTimeout|Read timed out|SSLError|ProxyError|"
    r"No matching distribution found for (torch|vllm)==",
)


def pip_env() -> dict[str, str]:
    """This machine's environment without its pip configuration files and wheel folders: the index alone."""
    env = {k: v for k, v in os.environ.items() if k not in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT")}
    env["PIP_CONFIG_FILE"] = os.devnull
    env.pop("PIP_NO_INDEX", None)
    return env


def pip(*args: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "pip", *args, "--retries", "2", "--timeout", "30", "--disable-pip-version-check"]
    return subprocess.Popen(cmd, cwd=REPO, env=pip_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen[str], what: str, timeout: float = 300) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"{what} took more than {timeout:.0f} s; pip's last lines:\n{out[-3000:]}")
    if proc.returncode != 0:
        if NETWORK_ERRORS.search(out):
            pytest.fail(
                f"{what} needs the package index (PyPI, or the one PIP_INDEX_URL names), which could not be reached "
                f"or did not list what it needs (CI has PyPI); pip said:\n{out[-3000:]}"
            )
        pytest.fail(f"{what} failed; pip said:\n{out[-4000:]}")
    return out


def resolve(report: Path, *requirements: str, find_links: Path | None = None) -> subprocess.Popen[str]:
    """`pip install --dry-run` for .venv-gpu's Python and platform; the report lists what it would install."""
    args = ["install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report)]
    args += ["--use-feature=fast-deps", "--only-binary=:all:", "--python-version", PYTHON, "--implementation", "cp"]
    for platform in PLATFORMS:
        args += ["--platform", platform]
    if find_links is not None:
        args += ["--find-links", str(find_links)]
    return pip(*args, *requirements)


def installed(report: Path) -> dict[str, dict[str, Any]]:
    """Each distribution the report would install, by canonical name: its metadata (name, version, requires_dist)."""
    items = json.loads(report.read_text())["install"]
    return {canonicalize_name(item["metadata"]["name"]): item["metadata"] for item in items}


def target_environment(extra: str = "") -> dict[str, str]:
    env = {key: str(value) for key, value in default_environment().items()}
    env.update(
        python_version=PYTHON,
        python_full_version=f"{PYTHON}.0",
        implementation_name="cpython",
        platform_python_implementation="CPython",
        sys_platform="linux",
        platform_system="Linux",
        platform_machine="x86_64",
        os_name="posix",
        extra=extra,
    )
    return env


def declared(metadata: dict[str, Any], extra: str = "") -> list[Requirement]:
    """The requirements a distribution declares for the target (with `extra`: those of that extra alone)."""
    out = []
    for line in metadata.get("requires_dist", []):
        req = Requirement(line)
        applies = req.marker is None or req.marker.evaluate(target_environment())
        if extra:  # required with the extra, not without
            applies = not applies and req.marker is not None and req.marker.evaluate(target_environment(extra))
        if applies:
            out.append(req)
    return out


def pin(requirements: list[Requirement], name: str) -> str:
    (req,) = [r for r in requirements if canonicalize_name(r.name) == name]
    (spec,) = req.specifier
    assert spec.operator == "==", req
    return spec.version


def pins(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            req = Requirement(line)
            if req.url is None:
                out[canonicalize_name(req.name)] = pin([req], canonicalize_name(req.name))
    return out


def test_the_gpu_environments_resolve_to_the_versions_verl_and_vllm_declare(tmp_path: Path) -> None:
    t0 = time.monotonic()
    # vLLM's set and the wheels of the source-only packages side by side, then the trainer's set
    vllm_report = tmp_path / "vllm.json"
    vllm = resolve(vllm_report, "-r", str(VLLM))
    try:
        wheels = tmp_path / "wheels"
        finish(
            pip("wheel", "--quiet", "--no-deps", "--no-binary", ":all:", "--wheel-dir", str(wheels), *SOURCE_ONLY),
            f"building {', '.join(SOURCE_ONLY)} (source archives on the index) into wheels",
        )
        trainer_report = tmp_path / "trainer.json"
        finish(resolve(trainer_report, *TRAINER_ARGS, find_links=wheels), "resolving the trainer's GPU environment")
        finish(vllm, "resolving vLLM's GPU environment")
    finally:
        if vllm.poll() is None:
            vllm.kill()
            vllm.communicate()
    took = time.monotonic() - t0

    # ---- the trainer's set: the pins, as resolved
    trainer = installed(trainer_report)
    for name, version in pins(TRAINER).items():
        assert trainer[name]["version"] == version, (name, trainer[name]["version"], version)
    torch = trainer["torch"]
    assert Version(torch["version"]).release[:2] == (2, 11)
    # PyPI's torch 2.11.0 for Linux x86_64 is the CUDA 13.0 build: it requires the CUDA 13.0 toolkit's wheels
    cuda = pin(declared(torch), "cuda-toolkit")
    assert Version(cuda).release[:2] == (13, 0) and trainer["cuda-toolkit"]["version"] == cuda
    assert {"nvidia-cudnn-cu13", "nvidia-nccl-cu13", "triton"} <= set(trainer)
    assert {"agl-core", "agl-trainer", "verl", "flash-attn"} - set(trainer) == {"flash-attn"}  # flash-attn: below

    # every requirement verl declares is met; and the pins are those of verl's own GPU extras
    verl = trainer["verl"]
    assert verl["version"] == "0.9.1"
    for req in declared(verl):
        have = trainer[canonicalize_name(req.name)]["version"]
        assert req.specifier.contains(have, prereleases=True), (str(req), have)
    for extra in ("fsdp", "vllm", "sglang", "megatron"):
        assert pin(declared(verl, extra), "torch") == torch["version"], extra
    for extra in ("vllm", "sglang"):
        assert pin(declared(verl, extra), "transformers") == trainer["transformers"]["version"], extra

    # ---- flash-attn: the wheel of verl's flash-attn extra (`flash-attn-cu130torch211`: the version it pins, for
    # the CUDA and torch its name gives), for .venv-gpu's Python
    (extra,) = [e for e in verl["provides_extra"] if e.startswith("flash-attn-")]
    built_for = re.fullmatch(r"flash-attn-cu(\d+)(\d)torch(\d)(\d+)", extra)
    assert built_for is not None, extra
    cuda_major, _cuda_minor, *torch_release = (int(n) for n in built_for.groups())
    assert (Version(cuda).major, list(Version(torch["version"]).release[:2])) == (cuda_major, torch_release)
    (line,) = [x for x in FLASH_ATTN.read_text().splitlines() if x.strip() and not x.startswith("#")]
    wheel = Requirement(line)
    assert canonicalize_name(wheel.name) == "flash-attn" and wheel.url is not None
    name, wheel_version, _build, tags = parse_wheel_filename(wheel.url.rsplit("/", 1)[1])
    assert name == "flash-attn" and str(wheel_version) == pin(declared(verl, extra), "flash-attn")
    cp = "cp" + PYTHON.replace(".", "")
    assert {(t.interpreter, t.abi, t.platform) for t in tags} == {(cp, cp, "linux_x86_64")}
    # installed without dependencies: its own (torch, einops) must be in the set
    assert "einops" in trainer

    # ---- vLLM's set: vllm 0.32.0, the CUDA build, on torch 2.13.0
    vllm_set = installed(vllm_report)
    assert vllm_set["vllm"]["version"] == "0.32.0"
    assert pin(declared(vllm_set["vllm"]), "torch") == vllm_set["torch"]["version"] == "2.13.0"
    assert Version(pin(declared(vllm_set["torch"]), "cuda-toolkit")).major == 13
    # vLLM's transformers is one the trainer's verl cannot share (hence two environments)
    assert not next(r for r in declared(verl) if r.name == "transformers").specifier.contains(
        vllm_set["transformers"]["version"]
    )

    # the Makefile installs what was resolved here
    makefile = (REPO / "Makefile").read_text()
    assert '-e packages/core -e "packages/trainer[verl]" -r requirements-gpu.txt' in makefile
    assert "--no-deps -r requirements-gpu-flash-attn.txt" in makefile
    assert re.search(r"^VLLM_CUDA\s*\?=\s*-r requirements-gpu-vllm.txt$", makefile, re.MULTILINE)
    print(
        f"resolved in {took:.0f} s: trainer torch {torch['version']} (CUDA {cuda}), transformers "
        f"{trainer['transformers']['version']}, verl {verl['version']}, flash-attn {wheel_version} wheel; vLLM "
        f"{vllm_set['vllm']['version']} on torch {vllm_set['torch']['version']}, transformers "
        f"{vllm_set['transformers']['version']}"
    )
    assert took < 240, f"resolving took {took:.0f} s"
