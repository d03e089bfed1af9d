"""mini-swe-agent, unchanged, as a rollout: its `mini` command in a fresh copy of the task's files, its every model
call (LiteLLM, `openai/<model>` at the attempt's URL) through agl under the agent `mini-swe-agent`, the reward from
the task's tests; the commands it ran read back from its trajectory as tool spans (AIR).

Task: {"files": folder to copy, "prompt": what to do, "test": shell command whose exit 0 means solved,
       "timeout_s": optional limit for mini, "trajectory": optional path to keep mini's trajectory at}.
mini-swe-agent is a program of its own (`make harnesses` installs the pinned one in .venv-harness, apart from agl's
.venv; AGL_MINI_SWE_AGENT names another `mini`). Run: agl worker examples/coding-agents/mini_swe_agent.py:repair
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import agl

PINNED = Path(__file__).resolve().parents[2] / ".venv-harness" / "bin" / "mini"
# mini-swe-agent's documented switches for a run with nobody at the terminal and a model LiteLLM has no price for:
# no first-run set-up prompt (MSWEA_CONFIGURED), no banner, cost errors ignored (MSWEA_COST_TRACKING), LiteLLM's
# price list read from the package instead of fetched from the network (LITELLM_LOCAL_MODEL_COST_MAP)
QUIET = {
    "MSWEA_CONFIGURED": "true",
    "MSWEA_SILENT_STARTUP": "1",
    "MSWEA_COST_TRACKING": "ignore_errors",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
}


def mini_command() -> str:
    found = os.environ.get("AGL_MINI_SWE_AGENT") or (str(PINNED) if PINNED.exists() else shutil.which("mini"))
    if not found:
        raise FileNotFoundError(f"mini-swe-agent not found at {PINNED} nor on PATH: `make harnesses` installs it")
    return found


@agl.rollout
def repair(task: dict[str, Any], llm: agl.LLM) -> float:
    with agl.workspace(task["files"]) as ws:
        home = agl.agent_home(ws)  # the sandbox's private home, outside the workspace: its config and trajectory
        trajectory = str(home / "trajectory.json")
        # headless: no confirmations (--yolo), no question at the end (--exit-immediately), no cost limit (-l 0)
        argv = [mini_command(), "-t", task["prompt"], "--yolo", "--exit-immediately", "-l", "0", "-o", trajectory]
        argv += ["-m", f"openai/{llm.model}"]  # LiteLLM's OpenAI client, at OPENAI_API_BASE: the attempt's URL
        env = {**QUIET, "MSWEA_GLOBAL_CONFIG_DIR": str(home / ".mini")}  # not the user's ~/.config/mini-swe-agent
        agl.run_cli(argv, llm=llm, agent="mini-swe-agent", cwd=ws, env=env, timeout_s=task.get("timeout_s", 600))
        agl.record_tool_runs(trajectory, "mini-swe-agent", agent="mini-swe-agent")  # its commands as tool spans (AIR)
        if task.get("trajectory"):  # kept where the task asks, once the agent is gone
            shutil.copyfile(trajectory, task["trajectory"], follow_symlinks=False)
        tests = agl.run_sandboxed(["sh", "-c", task["test"]], cwd=ws, timeout_s=120)  # model-written code: confined
        return 1.0 if tests.returncode == 0 else 0.0
