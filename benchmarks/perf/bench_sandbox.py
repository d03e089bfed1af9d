"""What agl's sandbox costs (docs/security.md): its start per command, and one QuixBugs harness step sandboxed and
bare, side by side in one run (this machine's load varies: compare within a run).

1. Start: `agl.run_sandboxed(["true"])` (the whole set-up: the LLM relay's and the egress proxy's threads, a
   cgroup where one may be made, bwrap, the supervisor as PID 1, the command, the tear-down) against
   `subprocess.run(["true"])`, alternating, `--starts` times each. The sandbox's start is the difference of the
   medians (target: at most 50 ms on 2 cores).
2. A harness step: one QuixBugs rollout through mini-swe-agent (from .venv-harness) repairing gcd.py against the
   scripted model (`cat`, a failing test run, the fix, submit: 4 calls), then the program's tests, in an in-process
   agl runner against a real `agl serve`; `--steps` times with `sandbox` = "bwrap" and "none", alternating.

    python benchmarks/perf/bench_sandbox.py [--starts 40] [--steps 3]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time

from _common import median, percentile, report, upstream_and_server

import agl


def start_cost(n: int) -> dict[str, float]:
    sandboxed, bare = [], []
    with tempfile.TemporaryDirectory(prefix="agl-bench-sandbox-") as folder:
        agl.run_sandboxed(["true"], cwd=folder)  # bubblewrap's check runs once per process: not a start's cost
        for _ in range(n):
            t0 = time.perf_counter()
            done = agl.run_sandboxed(["true"], cwd=folder, timeout_s=30)
            sandboxed.append(time.perf_counter() - t0)
            assert done.returncode == 0, done
            t0 = time.perf_counter()
            subprocess.run(["true"], check=True)
            bare.append(time.perf_counter() - t0)
    return {
        "sandboxed `true`, median (ms)": median(sandboxed) * 1000,
        "sandboxed `true`, p90 (ms)": percentile(sandboxed, 0.9) * 1000,
        "bare `true`, median (ms)": median(bare) * 1000,
        "the sandbox's start: the difference of the medians (ms)": (median(sandboxed) - median(bare)) * 1000,
    }


def harness_steps(n: int) -> dict[str, float]:
    from agl.capture.agent_loader import load_agent
    from agl.client import Client
    from agl.testing.fixtures import run_one
    from agl.testing.upstream import step_line
    from agl_bench.datasets import datasets_root
    from agl_bench.quixbugs.data import task_input
    from agl_bench.quixbugs.harness import mini_command
    from agl_bench.quixbugs.task import TASK

    mini_command()  # says `make harnesses` when mini-swe-agent is missing
    folder = datasets_root(None, "quixbugs") / "quixbugs"
    fixed = (folder / "correct_python_programs" / "gcd.py").read_text()

    def step(command: str) -> str:
        return step_line("bash", {"command": command})

    script = (
        "Repair {file}.\n"
        + step("cat gcd.py")
        + step("python3 -c 'import gcd; assert gcd.gcd(35, 21) == 7'")
        + step(f"cat > gcd.py <<'AGL_EOF'\n{fixed}AGL_EOF")
        + step("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")
    )
    task = {**task_input(folder, "gcd"), "harness": "mini-swe-agent", "harness_prompt": script}
    app = load_agent(TASK.agent)
    seconds: dict[str, list[float]] = {"bwrap": [], "none": []}
    with upstream_and_server() as (_, server), Client(server.url) as client:
        for _ in range(n):
            for kind in ("bwrap", "none"):
                t0 = time.perf_counter()
                detail = run_one(app, server, client, {**task, "sandbox": kind})
                seconds[kind].append(time.perf_counter() - t0)
                assert detail.rollout.final_reward == 1.0 and len(detail.llm_calls) == 4, (kind, detail.rollout)
    sandboxed, bare = median(seconds["bwrap"]), median(seconds["none"])
    return {
        "harness step sandboxed, median (s)": sandboxed,
        "harness step bare, median (s)": bare,
        "sandboxed / bare": sandboxed / bare,
        "steps each": float(n),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--starts", type=int, default=40)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    report("sandbox_start", start_cost(args.starts))
    report("sandbox_harness_step", harness_steps(args.steps))


def smoke() -> None:
    main(["--starts", "3", "--steps", "1"])


if __name__ == "__main__":
    main(sys.argv[1:])
