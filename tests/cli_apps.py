"""A rollout that runs a command-line agent (tests/cli_agent_script.py) in a workspace of its own: `agl.workspace`
and `agl.run_cli`, as a coding agent's harness runs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import agl

SCRIPT = str(Path(__file__).with_name("cli_agent_script.py"))


@agl.rollout
def solve(task: dict[str, Any], llm: agl.LLM) -> float:
    with agl.workspace(task["files"]) as ws:
        argv = [sys.executable, SCRIPT] + (["--hang", "--beats", task["beats"]] if task.get("hang") else [])
        argv += ["--sub-agents"] if task.get("sub_agents") else []
        # the folder the hanging program writes its beats to: writable by name, as a task names what it needs
        sandbox = agl.Sandbox(writable=(task["beats"],)) if task.get("hang") else None
        done = agl.run_cli(
            argv, llm=llm, agent="cli-agent", cwd=ws, timeout_s=task.get("timeout_s", 60), sandbox=sandbox
        )
        answered = (ws / "answer.txt").exists()
        agl.emit_reward(1.0 if done.timed_out else 0.0, name="timed_out")
    return 1.0 if answered and done.returncode == 0 and "done" in done.output_tail else 0.0
