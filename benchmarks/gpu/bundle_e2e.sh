#!/usr/bin/env bash
# The GPU bundle end to end on this CPU machine, as close to the lent GPU machine as it allows: a Python 3.12
# virtual environment with that machine's torch (2.11.0: PyPI's build, for CUDA 13, which also runs on a CPU),
# transformers 5.17.0, peft 0.21.0 and the other packages of the machine that the run touches, and none of what
# the bundle brings; then the bundle built (benchmarks/gpu/bundle.py), installed from its tar
# (install_bundle.sh, no index) and smoke.sh's verl-update stage run with it on the CPU, with a model of the bundled
# model's shape and random weights built from the bundle (no GGUF there), as on the GPU machine.
#
#   bash benchmarks/gpu/bundle_e2e.sh
#
# Knobs: AGL_E2E_VENV (default /tmp/agl-py312-gpu-like; kept, and reused by the next run), AGL_E2E_PYTHON312 (the
# Python 3.12 to make it with; default: found on PATH or under ~/.pyenv), AGL_E2E_BUNDLE (the bundle folder;
# default: a fresh one in a temp dir). Takes 10-15 minutes on 2 cores: ~3.5 GB of wheels (torch and its CUDA
# libraries) the first time, the stage's two updates ~8 min.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
VENV=${AGL_E2E_VENV:-/tmp/agl-py312-gpu-like}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/agl-e2e.XXXXXX")
BUNDLE=${AGL_E2E_BUNDLE:-$TMP/bundle}
T0=$SECONDS
say() { printf '\n=== [%4ds] %s\n' "$((SECONDS - T0))" "$*"; }

find_python312() {
    local candidate
    for candidate in "${AGL_E2E_PYTHON312:-}" "$(command -v python3.12 || true)" "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
        [[ -n "$candidate" && -x "$candidate" ]] || continue
        if "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}

say "a Python 3.12 environment like the GPU machine's in $VENV"
if [[ ! -x "$VENV/bin/python" ]]; then
    PY312=$(find_python312) || { echo "no Python 3.12 found: set AGL_E2E_PYTHON312" >&2; exit 2; }
    "$PY312" -m venv "$VENV"
fi
# the GPU machine's packages that verl's actor, Ray and agl import (its full list: the device docs); pydantic and
# the rest of agl's server stack are not there, so they are not here either: the bundle brings them
"$VENV/bin/python" -m pip install --disable-pip-version-check --quiet torch==2.11.0 transformers==5.17.0 \
    peft==0.21.0 accelerate safetensors tokenizers numpy pyyaml psutil packaging filelock fsspec huggingface-hub \
    jinja2 requests click rich tqdm regex protobuf msgpack aiohttp httpx pandas pyarrow grpcio cloudpickle \
    typing-extensions pillow uvloop typer matplotlib 2>&1 | grep -v "is ignored: it is neither a file nor a directory" || true
"$VENV/bin/python" -m pip uninstall --disable-pip-version-check --quiet -y pydantic pydantic-core annotated-types \
    typing-inspection 2>/dev/null || true
"$VENV/bin/python" -c 'import torch, transformers, peft
print("torch", torch.__version__, "| transformers", transformers.__version__, "| peft", peft.__version__)'

say "the bundle, built into $BUNDLE"
if [[ ! -f "$BUNDLE/manifest.json" ]]; then
    python3 "$HERE/bundle.py" build --out "$BUNDLE"
fi
python3 "$HERE/bundle.py" check --out "$BUNDLE"

say "smoke.sh's verl-update stage on the CPU, the bundle installed from its tar"
rc=0
RAY_memory_monitor_refresh_ms=0 AGL_SMOKE_STAGES=verl-update AGL_SMOKE_DEVICE=cpu AGL_SMOKE_PYTHON="$VENV/bin/python" \
    AGL_SMOKE_BUNDLE="$BUNDLE" AGL_SMOKE_BUNDLE_TARGET="$TMP/site" bash "$ROOT/benchmarks/gpu/smoke.sh" || rc=$?
say "done: smoke.sh exited with $rc"
rm -rf "$TMP"
exit "$rc"
