"""Claude Code, unchanged, as a rollout: `claude -p` in a fresh copy of the task's files, its every model call
through agl's Anthropic Messages route under the agent `claude-code` (its sub-agents' under `claude-code/subagent`),
its tool runs read back from its event stream as tool spans (AIR), the reward from the task's tests.

Task: {"files": folder to copy, "prompt": what to do, "test": shell command whose exit 0 means solved,
       "timeout_s": optional limit for Claude Code}.
Claude Code comes from npm (`make harnesses` installs the pinned one in examples/coding-agents/node_modules;
AGL_CLAUDE_CODE names another `claude`). Run: agl worker examples/coding-agents/claude_code.py:repair
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import agl

PINNED = Path(__file__).with_name("node_modules") / ".bin" / "claude"
# Claude Code's documented switches for traffic other than the model's: no telemetry, error reports, update checks
QUIET = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
}


def claude_command() -> str:
    found = os.environ.get("AGL_CLAUDE_CODE") or (str(PINNED) if PINNED.exists() else shutil.which("claude"))
    if not found:
        raise FileNotFoundError(f"Claude Code not found at {PINNED} nor on PATH: `make harnesses` installs it")
    return found


@agl.rollout
def repair(task: dict[str, Any], llm: agl.LLM) -> float:
    with agl.workspace(task["files"]) as ws:
        # its events as JSON lines: every tool run and how it ended, read back below for AIR
        argv = [claude_command(), "-p", task["prompt"], "--output-format", "stream-json", "--verbose"]
        # headless: edits and the listed tools (Agent: its sub-agents) need no confirmation; sessions in the workspace
        argv += ["--permission-mode", "acceptEdits", "--allowedTools", "Read,Edit,Write,Bash,Glob,Grep,Agent"]
        # in agl's sandbox: only the workspace writable, its config and sessions in a private home outside it
        done = agl.run_cli(argv, llm=llm, agent="claude-code", cwd=ws, env=QUIET, timeout_s=task.get("timeout_s", 600))
        agl.record_tool_runs(done, "claude-code", agent="claude-code")  # its tool runs as tool spans (AIR)
        tests = agl.run_sandboxed(["sh", "-c", task["test"]], cwd=ws, timeout_s=120)  # model-written code: confined
        return 1.0 if tests.returncode == 0 else 0.0
