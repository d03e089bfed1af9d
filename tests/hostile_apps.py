"""Rollouts that run a hostile command-line agent (tests/hostile_agent.py) as a harness is run: `agl.workspace` and
`agl.run_cli` with agl's default sandbox (small limits so that the bombs end soon), then, as an evaluator does,
read what it left. Every attack's rollout returns 0.0: a reward of 1.0 anywhere means the agent graded itself.

A `victim` rollout runs beside them: its workspace holds its work, whose path it leaves where the attackers' rollout
functions (not the attackers) read it, as if guessed; it waits for them and returns 1.0 only if its workspace is as
it left it."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import agl

SCRIPT = str(Path(__file__).with_name("hostile_agent.py"))
VICTIM_WORK = "the victim's work\n"
LIMITS = agl.Limits(processes=64, memory_mb=256, disk_mb=48, tmp_mb=16)


@agl.rollout
def attack(task: dict[str, Any], llm: agl.LLM) -> float:
    shared = Path(task["shared"])  # the test's folder for the rollout functions (never shown to an agent)
    if task["mode"] == "victim":
        return _victim(shared, task["attackers"])
    plan = {**task.get("plan", {}), "mode": task["mode"]}
    if task["mode"] in ("write_outside", "read_secrets"):
        victim = Path(_wait_for(shared / "victim-path.txt").read_text()) / "work.txt"
        plan["targets"] = [*plan["targets"], str(victim)]
    writable = tuple(task.get("writable", ()))
    with agl.workspace() as ws:
        done = agl.run_cli(
            [sys.executable, SCRIPT, json.dumps(plan)],
            llm=llm,
            agent="hostile",
            cwd=ws,
            timeout_s=task.get("timeout_s", 30),
            sandbox=agl.Sandbox(writable=writable, limits=LIMITS),
        )
        if task["mode"] == "symlinks":  # the evaluator reads the answer it left, then runs the tests on it
            try:
                said = agl.read_agent_file(ws / "answer.txt").decode(errors="replace")
            except ValueError as exc:
                said = f"not read: {exc}"
            tests = agl.run_sandboxed(["cat", "answer.txt", "root_link/etc/hostname"], cwd=ws, timeout_s=30)
            agl.emit_reward(0.0, name="evaluated", read=said, tests=tests.stdout.decode())
        if task["mode"] == "test_bomb":  # the evaluator runs the test it left: in a sandbox too
            tests = agl.run_sandboxed(
                [sys.executable, "test_answer.py"], cwd=ws, timeout_s=30, sandbox=agl.Sandbox(limits=LIMITS)
            )
            agl.emit_reward(0.0, name="evaluated", breaches=tests.breaches)
        if task["mode"] == "write_outside":  # what is beside the workspace on this side: the home and transcripts
            agl.emit_reward(0.0, name="evaluated", beside=sorted(p.name for p in ws.parent.iterdir()))
        (shared / f"done-{task['mode']}").write_text(str(done.returncode))
    return 0.0


def _victim(shared: Path, attackers: list[str]) -> float:
    with agl.workspace() as ws:
        (ws / "work.txt").write_text(VICTIM_WORK)
        (shared / "victim-path.txt").write_text(str(ws))
        for mode in attackers:
            _wait_for(shared / f"done-{mode}")
        intact = sorted(p.name for p in ws.iterdir()) == ["work.txt"] and (ws / "work.txt").read_text() == VICTIM_WORK
        return 1.0 if intact else 0.0


def _wait_for(path: Path, timeout_s: float = 120.0) -> Path:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.05)
    return path
