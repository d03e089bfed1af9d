"""Helpers of benchmarks/gpu/smoke.sh (`report` needs only the standard library; `info` and `eval-tasks` import agl).

python3 smoke.py info [DEVICE]              the GPU as torch sees it; imports what agl needs at run time;
                                            exit 1 when DEVICE is cuda* and torch sees no CUDA device
python3 smoke.py model OUT                  a model of SmolLM2-135M-Instruct's shape with random weights, from
                                            the config and tokenizer of the GPU bundle's agl-smollm2-shape
python3 smoke.py eval-tasks N OUT.jsonl     the calculator example's first N held-out tasks, as JSONL
python3 smoke.py report RUN_DIR STEPS [SMI_CSV]
                                            the run's metrics per step; exit 1 unless steps 0..STEPS-1 all
                                            have a train row (SMI_CSV: nvidia-smi samples `pid, MiB`)
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

# what agl-core, agl-trainer and the calculator example import at run time (checked before the run starts)
RUNTIME_MODULES = {  # module: the distribution whose version is shown (None: show where it comes from)
    "transformers": "transformers",
    "peft": "peft",
    "gguf": "gguf",
    "pydantic": "pydantic",
    "fastapi": "fastapi",
    "starlette": "starlette",
    "uvicorn": "uvicorn",
    "httptools": "httptools",
    "orjson": "orjson",
    "openai": "openai",
    "google.protobuf": "protobuf",
    "opentelemetry.sdk": "opentelemetry-sdk",
    "opentelemetry.proto.collector.trace.v1.trace_service_pb2": "opentelemetry-proto",
    "agl.server.app": None,
    "agl_trainer.run.loop": None,
}


# the package of the GPU bundle with the bundled model's config and tokenizer, no weights (benchmarks/gpu/bundle.py)
SHAPE_PACKAGE = "agl_smollm2_shape"
# what the model folder takes from it besides config.json (the weights are made here; generation_config comes with them)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def info(device: str = "cuda") -> int:
    import importlib
    from importlib import metadata

    import torch

    failed = 0
    for name, dist in RUNTIME_MODULES.items():
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # report every missing piece at once
            failed += 1
            print(f"  {name}: IMPORT FAILED: {type(exc).__name__}: {exc}")
            continue
        try:
            where = metadata.version(dist) if dist else module.__file__
        except metadata.PackageNotFoundError:
            where = getattr(module, "__version__", "?")
        print(f"  {name} {where}")
    if failed:
        print(f"{failed} module(s) cannot be imported: the run would fail")
        return 1

    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), cuda available: {torch.cuda.is_available()}")
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        print(f"cuda:{i} {torch.cuda.get_device_name(i)}, {props.total_memory / 2**30:.1f} GiB")
    if device.startswith("cuda") and not torch.cuda.is_available():
        print(f"FAIL: the device is {device} and torch sees no CUDA device (AGL_SMOKE_DEVICE=cpu for a CPU run)")
        return 1
    return 0


def build_model(out: str, seed: int = 0) -> int:
    """SmolLM2-135M-Instruct's architecture, tokenizer and chat template with randomly initialised weights (fp32,
    safetensors), for a machine that has the GPU bundle but not the model's 93 MB GGUF: every code path and every
    memory figure of the real model, none of its answers (verl_update.py caps each sample of a group at a different
    length, so that a model that never stops still gives the group rewards that differ)."""
    import importlib.util
    import shutil
    import time

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = importlib.util.find_spec(SHAPE_PACKAGE)
    if spec is None or spec.origin is None:
        print(f"{SHAPE_PACKAGE} is not installed: it comes with the GPU bundle (benchmarks/gpu/bundle.py)")
        return 1
    source = Path(spec.origin).parent / "model"
    t0 = time.perf_counter()
    config = AutoConfig.from_pretrained(source)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).float()
    target = Path(out)
    model.save_pretrained(target, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, target / name)
    count = sum(p.numel() for p in model.parameters())
    print(
        f"{config.model_type} of {count / 1e6:.1f} M parameters, random weights, in {target} "
        f"({time.perf_counter() - t0:.1f} s)"
    )
    return 0


def eval_tasks(n: int, out: str) -> int:
    from agl_trainer.examples.calculator import eval_tasks as tasks

    chosen = tasks()[:n]
    Path(out).write_text("".join(json.dumps(t) + "\n" for t in chosen))
    print(f"{len(chosen)} held-out tasks -> {out}")
    return 0


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


def _smi_peak_mib(path: Path) -> float | None:
    """The largest per-process GPU memory nvidia-smi reported (what the allocator reserved plus the context)."""
    if not path.is_file():
        return None
    peak = None
    for line in path.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2:
            try:
                mib = float(parts[1].split()[0])
            except (ValueError, IndexError):
                continue
            peak = mib if peak is None else max(peak, mib)
    return peak


def report(run_dir: str, steps: int, smi_csv: str | None = None) -> int:
    path = Path(run_dir) / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    train = {int(r["step"]): r for r in rows if r.get("kind") == "train"}
    print(f"metrics: {path} ({len(rows)} rows)")
    header = (
        f"{'step':>4} {'reward':>7} {'success':>7} {'transit.':>8} {'failed':>6} "
        f"{'rollout_s':>9} {'update_s':>8} {'gen tok/s':>9} {'gpu peak GiB':>12}"
    )
    print(header)
    for step in sorted(train):
        r = train[step]
        print(
            f"{step:>4} {_fmt(r.get('reward_mean'), '.3f'):>7} {_fmt(r.get('success_rate'), '.2f'):>7} "
            f"{_fmt(r.get('transitions'), 'd'):>8} {_fmt(r.get('failed'), 'd'):>6} "
            f"{_fmt(r.get('rollout_s'), '.1f'):>9} {_fmt(r.get('update_s'), '.2f'):>8} "
            f"{_fmt(r.get('gen_tokens_per_s'), '.0f'):>9} {_fmt(r.get('gpu_peak_gib'), '.2f'):>12}"
        )
    for r in rows:
        if r.get("kind") == "eval":
            print(f"eval @ step {r['step']}: accuracy {_fmt(r.get('accuracy'), '.3f')} over {r.get('n')} tasks")
    peaks = [r["gpu_peak_gib"] for r in train.values() if isinstance(r.get("gpu_peak_gib"), (int, float))]
    rates = [r["gen_tokens_per_s"] for r in train.values() if isinstance(r.get("gen_tokens_per_s"), (int, float))]
    print(
        "peak GPU memory allocated by the trainer process: "
        + (f"{max(peaks):.2f} GiB" if peaks else "n/a (no gpu_peak_gib in the rows: not on CUDA?)")
    )
    if rates:
        print(f"generation: {sum(rates) / len(rates):.0f} tokens/s (mean over steps)")
    else:
        print("generation: n/a (no gen_tokens_per_s in the rows)")
    smi = _smi_peak_mib(Path(smi_csv)) if smi_csv else None
    if smi is not None:
        print(f"nvidia-smi peak per-process GPU memory (reserved + context): {smi / 1024:.2f} GiB")
    missing = [s for s in range(steps) if s not in train]
    if missing:
        print(f"FAIL: no train metrics row for step(s) {missing}")
        return 1
    print(f"OK: {steps} train step(s) with metrics rows")
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["info"] and len(argv) in (1, 2):
        return info(*argv[1:])
    if argv[:1] == ["model"] and len(argv) == 2:
        return build_model(argv[1])
    if argv[:1] == ["eval-tasks"] and len(argv) == 3:
        return eval_tasks(int(argv[1]), argv[2])
    if argv[:1] == ["report"] and len(argv) in (3, 4):
        return report(argv[1], int(argv[2]), argv[3] if len(argv) == 4 else None)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
