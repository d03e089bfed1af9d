"""Peak memory of the main job: the trainer, the server and one worker, over a short run of `agl train --example
calculator` (the main job's configuration, fewer steps).

Every `--interval` seconds the processes' resident memory (RSS) is read; the trainer's peak is its kernel
high-water mark (VmHWM, exact even between samples), the others' the highest sample. Printed, and written as JSON
with the trainer's timeline next to the other benchmarks' results.

    python benchmarks/perf/bench_memory.py                  # 2 steps (about 4 minutes on 2 cores)
    python benchmarks/perf/bench_memory.py --steps 1 --eval-limit 16 --config my-options.toml
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from _common import RESULTS_DIR, report

from agl_trainer.policy.memory import peak_resident_bytes

GIB = 2**30


def role(proc: psutil.Process) -> str | None:
    """Which part of the run a child process is: its command line names it."""
    try:
        words = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    if "serve" in words:
        return "server"
    if "worker" in words:
        return "worker"
    return None


class Sampler(threading.Thread):
    def __init__(self, trainer: psutil.Process, interval: float) -> None:
        super().__init__(daemon=True)
        self.trainer, self.interval = trainer, interval
        self.peaks: dict[str, int] = {"trainer": 0, "server": 0, "worker": 0}
        self.timeline: list[tuple[float, int]] = []  # (seconds, trainer RSS)
        self.stop = threading.Event()
        self.t0 = time.monotonic()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                rss = self.trainer.memory_info().rss
                self.peaks["trainer"] = max(self.peaks["trainer"], peak_resident_bytes(self.trainer.pid), rss)
                self.timeline.append((round(time.monotonic() - self.t0, 1), rss))
                for child in self.trainer.children(recursive=True):
                    kind = role(child)
                    if kind is not None:
                        try:
                            self.peaks[kind] = max(self.peaks[kind], child.memory_info().rss)
                        except psutil.NoSuchProcess:
                            pass
            except psutil.NoSuchProcess:
                return
            self.stop.wait(self.interval)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--config", default=None, help="an option file for agl train (e.g. other batch sizes)")
    parser.add_argument("--eval-limit", type=int, default=None, help="evaluate on the first N held-out tasks only")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="agl-bench-memory-") as tmp:
        command = [sys.executable, "-m", "agl.cli.main", "train", "--example", "calculator"]
        command += ["--steps", str(args.steps), "--run-dir", str(Path(tmp) / "run")]
        if args.config:
            command += ["--config", args.config]
        if args.eval_limit:
            from agl_trainer.examples.calculator import eval_tasks

            held_out = Path(tmp) / "eval.jsonl"
            held_out.write_text("".join(json.dumps(t) + "\n" for t in eval_tasks()[: args.eval_limit]))
            command += ["--eval-tasks", str(held_out)]
        start = time.monotonic()
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        sampler = Sampler(psutil.Process(proc.pid), args.interval)
        sampler.start()
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            print("  | " + line.rstrip(), flush=True)  # the run's own progress
            if "held-out accuracy" in line:
                sampler.peaks["trainer"] = max(sampler.peaks["trainer"], peak_resident_bytes(proc.pid))
        code = proc.wait()
        sampler.stop.set()
        sampler.join()
        wall = time.monotonic() - start
    if code != 0:
        raise SystemExit(f"agl train exited with {code}:\n" + "".join(lines[-30:]))
    rows: dict[str, Any] = {
        "steps": args.steps,
        "wall_s": round(wall, 1),
        "trainer peak RSS GiB": sampler.peaks["trainer"] / GIB,
        "server peak RSS GiB": sampler.peaks["server"] / GIB,
        "one worker peak RSS GiB": sampler.peaks["worker"] / GIB,
        "meets target": sampler.peaks["trainer"] <= 2.5 * GIB,
        "trainer timeline (s, bytes)": sampler.timeline,
    }
    shown = {k: v for k, v in rows.items() if not k.startswith("trainer timeline")}
    report("memory of the main job", shown)
    timeline = RESULTS_DIR / "memory of the main job (trainer timeline).json"
    timeline.write_text(json.dumps(sampler.timeline) + "\n")
    print(f"  trainer RSS every {args.interval:g} s: {timeline}")
    return rows


def smoke() -> None:
    """`make bench-smoke`: that this script runs, at a small size (the numbers are not judged)."""
    main(["--steps", "1", "--eval-limit", "4"])


if __name__ == "__main__":
    main()
