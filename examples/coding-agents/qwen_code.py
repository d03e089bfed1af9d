"""Qwen Code, unchanged, as a rollout: `qwen` (one-shot, headless) in a fresh copy of the task's files, its every
model call through agl's chat-completions route under the agent `qwen-code` (its OpenAI auth type at the attempt's
URL), its tool runs read back from its event stream as tool spans (AIR), the reward from the task's tests.

Task: {"files": folder to copy, "prompt": what to do, "test": shell command whose exit 0 means solved,
       "timeout_s": optional limit for Qwen Code}.
Its `agent` tool's sub-agents send their calls with the same headers and fields as Qwen Code's own (0.24: only
their system prompt differs), so agl stores them under `qwen-code` too, and their tool runs with them; pass
`--exclude-tools agent` where only the harness's own turns should train.
Qwen Code comes from npm (`make harnesses` installs the pinned one in examples/coding-agents/qwen-code/;
AGL_QWEN_CODE names another `qwen`). Run: agl worker examples/coding-agents/qwen_code.py:repair
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import agl

PINNED = Path(__file__).with_name("qwen-code") / "node_modules" / ".bin" / "qwen"
# Qwen Code's settings (~/.qwen/settings.json, its docs' "Configuration") for traffic other than the model's: no
# telemetry, usage statistics or update checks
SETTINGS = {
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"enableAutoUpdate": False},
}
QUIET = {"QWEN_CODE_SUPPRESS_YOLO_WARNING": "1"}  # agl's sandbox confines it: its warning of none says nothing


def qwen_command() -> str:
    found = os.environ.get("AGL_QWEN_CODE") or (str(PINNED) if PINNED.exists() else shutil.which("qwen"))
    if not found:
        raise FileNotFoundError(f"Qwen Code not found at {PINNED} nor on PATH: `make harnesses` installs it")
    return found


@agl.rollout
def repair(task: dict[str, Any], llm: agl.LLM) -> float:
    with agl.workspace(task["files"]) as ws:
        home = agl.agent_home(ws)  # its settings and sessions in a private home outside the workspace
        (home / ".qwen").mkdir(exist_ok=True)
        (home / ".qwen" / "settings.json").write_text(json.dumps(SETTINGS))
        # OpenAI auth: its client at OPENAI_BASE_URL (the attempt's URL); headless one-shot (the prompt positional),
        # every tool run without asking (--yolo), its events as JSON lines: every tool run and how it ended
        argv = [qwen_command(), "--auth-type", "openai", "-m", llm.model, "--yolo", "--output-format", "stream-json"]
        argv += [task["prompt"]]
        done = agl.run_cli(argv, llm=llm, agent="qwen-code", cwd=ws, env=QUIET, timeout_s=task.get("timeout_s", 600))
        agl.record_tool_runs(done, "qwen-code", agent="qwen-code")  # its tool runs as tool spans (AIR)
        tests = agl.run_sandboxed(["sh", "-c", task["test"]], cwd=ws, timeout_s=120)  # model-written code: confined
        return 1.0 if tests.returncode == 0 else 0.0
