"""`make bench-smoke`: every benchmark script under this folder runs to the end at a small size (the numbers are
not judged), so that none can rot unnoticed — as bench_spans.py once did, failing with 404 long after the
server started refusing spans of rollouts that do not exist. Each `bench_*.py` must define `smoke()`; a script
without one fails this run. Each runs in its own process with a time limit; the figures go to a temporary
folder, not to results/.

    python benchmarks/perf/smoke.py                  # every script (but those a test runs: RUN_BY_TESTS)
    python benchmarks/perf/smoke.py bench_spans      # some
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# bench_train_step, bench_trainers and bench_vllm_cpu ran past 600 s beside the heaviest tests on 2026-11-28
LIMIT_S = 900
# Scripts whose main() a test of `make test` already runs to the end (at a size the test checks): run again here
# they would only add CI time (bench_memory's smoke took over 600 s on a slow day). Named explicitly to run them.
RUN_BY_TESTS = {
    "bench_memory": "tests/test_main_job_memory.py",
    "bench_update_memory": "packages/trainer/tests/test_plan_parts.py",
}


def scripts(names: list[str]) -> list[str]:
    found = sorted(p.stem for p in HERE.glob("bench_*.py"))
    if names:
        unknown = sorted(set(names) - set(found))
        if unknown:
            raise SystemExit(f"no such benchmark: {', '.join(unknown)} (there are: {', '.join(found)})")
        return [n for n in found if n in names]
    return found


def main(argv: list[str]) -> int:
    chosen = scripts(argv)
    missing = [n for n in chosen if "\ndef smoke(" not in (HERE / f"{n}.py").read_text()]
    results: list[tuple[str, str, float]] = []
    with tempfile.TemporaryDirectory(prefix="agl-bench-smoke-") as out:
        env = {**os.environ, "AGL_BENCH_OUT": out}
        for name in chosen:
            if name in RUN_BY_TESTS and not argv:
                results.append((name, f"run by {RUN_BY_TESTS[name]}", 0.0))
                continue
            if name in missing:
                results.append((name, "no smoke() function", 0.0))
                continue
            print(f"== {name}", flush=True)
            code = f"import sys; sys.path.insert(0, {str(HERE)!r}); import {name}; {name}.smoke()"
            t0 = time.monotonic()
            # a session of its own: a script over its limit is killed with every process it started (a benchmark
            # starts servers, workers and trainers, which would otherwise run on, orphaned)
            proc = subprocess.Popen([sys.executable, "-c", code], cwd=HERE, env=env, start_new_session=True)
            try:
                returncode = proc.wait(timeout=LIMIT_S)
                verdict = "ok" if returncode == 0 else f"exit {returncode}"
            except subprocess.TimeoutExpired:
                verdict = f"over {LIMIT_S} s"
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            results.append((name, verdict, time.monotonic() - t0))
    print("\n== bench-smoke")
    for name, verdict, seconds in results:
        print(f"  {name:<24} {verdict:<22} {seconds:6.1f} s")
    failed = [name for name, verdict, _ in results if verdict != "ok" and not verdict.startswith("run by ")]
    if failed:
        print(f"FAILED: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
