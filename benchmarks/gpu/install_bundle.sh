#!/usr/bin/env bash
# Installs the GPU bundle that benchmarks/gpu/bundle.py built (verl 0.9.1, a stripped Ray, what their actor
# imports, agl's runtime, the bundled model's shape) on a machine without network: checks the tar against the
# manifest, checks every wheel in it, and installs the wheels into TARGET with `pip install --no-index --no-deps
# --target`. Put TARGET on PYTHONPATH afterwards (the last line printed says how); smoke.sh does so by itself with
# AGL_SMOKE_BUNDLE (into AGL_SMOKE_BUNDLE_TARGET).
#
#   bash benchmarks/gpu/install_bundle.sh [--check-only] [BUNDLE_DIR] [TARGET]
#     BUNDLE_DIR  the folder with manifest.json and verl-bundle.tar (default: benchmarks/gpu/verl-bundle)
#     TARGET      where the packages go (default: /tmp/agl-bundle-site)
#     --check-only  says whether the tar is there and whole; installs nothing
#   AGL_BUNDLE_PYTHON  the Python whose pip installs (default python3); the wheels are for CPython 3.12
#
# The bundle is one tar of at most 60 MiB, which one call to a lent GPU machine carries with the working tree
# (an older bundle's manifest may list several parts: they are joined in order).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CHECK_ONLY=0
if [[ "${1:-}" == "--check-only" ]]; then
    CHECK_ONLY=1
    shift
fi
BUNDLE=${1:-$HERE/verl-bundle}
TARGET=${2:-/tmp/agl-bundle-site}
PY=${AGL_BUNDLE_PYTHON:-python3}
MANIFEST=$BUNDLE/manifest.json
[[ -f "$MANIFEST" ]] || { echo "no manifest at $MANIFEST: carry benchmarks/gpu/verl-bundle/manifest.json" >&2; exit 2; }

# the parts: name, size, sha256 per line (the manifest is read with Python's json: no jq on the machine)
mapfile -t PARTS < <("$PY" -c 'import json, sys
for p in json.load(open(sys.argv[1]))["parts"]: print(p["name"], p["size"], p["sha256"])' "$MANIFEST")
missing=0
for line in "${PARTS[@]}"; do
    read -r name size sum <<<"$line"
    path=$BUNDLE/$name
    if [[ ! -f "$path" ]]; then
        echo "part $name: not here yet"
        missing=1
    elif [[ $(stat -c %s "$path") != "$size" ]] || [[ $(sha256sum "$path" | cut -d' ' -f1) != "$sum" ]]; then
        echo "part $name: size or sha256 differs from the manifest" >&2
        exit 1
    else
        echo "part $name: ok ($size bytes)"
    fi
done
if [[ $CHECK_ONLY == 1 ]]; then
    exit "$missing"
fi
[[ $missing == 0 ]] || { echo "the bundle is not all here: carry what the manifest lists" >&2; exit 1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/agl-bundle.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
for line in "${PARTS[@]}"; do
    read -r name _ _ <<<"$line"
    cat "$BUNDLE/$name"
done | tar -x -C "$WORK"
# every wheel against the manifest before pip sees it
"$PY" - "$MANIFEST" "$WORK/wheels" <<'EOF'
import hashlib, json, sys
from pathlib import Path
manifest, folder = json.load(open(sys.argv[1])), Path(sys.argv[2])
bad = [w["name"] for w in manifest["wheels"]
       if hashlib.sha256((folder / w["name"]).read_bytes()).hexdigest() != w["sha256"]]
if bad:
    sys.exit(f"wheels differ from the manifest: {bad}")
print(f"{len(manifest['wheels'])} wheels match the manifest")
EOF
mkdir -p "$TARGET"
"$PY" -m pip install --no-index --no-deps --disable-pip-version-check --quiet --upgrade --target "$TARGET" \
    "$WORK"/wheels/*.whl
cp "$MANIFEST" "$TARGET/agl-bundle-manifest.json"
echo "installed $(ls "$WORK"/wheels | wc -l) wheels into $TARGET"
echo "export PYTHONPATH=$TARGET\${PYTHONPATH:+:\$PYTHONPATH}"
