"""Aider, unchanged, as a rollout: `aider --message` in a fresh copy of the task's files, its every model call
(LiteLLM, `openai/<model>` at the attempt's URL) through agl's chat-completions route under the agent `aider`, its
edits and the test runs it does after them (`--test-cmd` with `--auto-test`) read back from its chat history as
tool spans (AIR), the reward from the task's tests.

Task: {"files": folder to copy, "prompt": what to do, "test": shell command whose exit 0 means solved (Aider runs
       it after each edit and, when it fails, asks the model to fix it), "edit": optional files to add to the chat
       (else Aider adds those the model names), "edit_format": optional, Aider's edit format (default `diff`, its
       SEARCH/REPLACE blocks: for a model it has no settings for it would pick `whole`, every file rewritten),
       "timeout_s": optional limit for Aider}.
Aider sends `temperature: 0`: its calls train only where the run owns the sampling (`agl train` does, `agl serve
--own-sampling-for aider`). Aider calls no tools: its edits are SEARCH/REPLACE blocks in the model's text.
Aider is a program of its own (`make harnesses` installs the pinned one in .venv-aider, apart from agl's .venv and
from mini-swe-agent's; AGL_AIDER names another `aider`). Run: agl worker examples/coding-agents/aider.py:repair
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import agl

PINNED = Path(__file__).resolve().parents[2] / ".venv-aider" / "bin" / "aider"
# LiteLLM's price list read from the package instead of fetched from the network (LiteLLM reads it at import)
# LiteLLM's bundled price list (no download); and no bytecode cache for the tests Aider runs: an edit of the same
# size within the second of the last run leaves calc.py's mtime and size as cached, and Python ran the stale module
QUIET = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONDONTWRITEBYTECODE": "1"}
# Aider's documented switches (aider.chat/docs/config/options.html) for a run with nobody at the terminal and no
# traffic but the model's: every question answered yes, no git (the workspace is no repository; nothing committed),
# plain output, no update check, analytics, release notes, model warnings or URL fetching. Shell commands the model
# suggests are never run under --yes-always (Aider asks for an explicit yes), so it is told not to suggest them.
FLAGS = [
    "--yes-always",
    "--no-git",
    "--no-auto-commits",
    "--no-pretty",
    "--no-check-update",
    "--analytics-disable",
    "--no-show-release-notes",
    "--no-show-model-warnings",
    "--no-detect-urls",
    "--no-suggest-shell-commands",
]


def aider_command() -> str:
    found = os.environ.get("AGL_AIDER") or (str(PINNED) if PINNED.exists() else shutil.which("aider"))
    if not found:
        raise FileNotFoundError(f"Aider not found at {PINNED} nor on PATH: `make harnesses` installs it")
    return found


@agl.rollout
def repair(task: dict[str, Any], llm: agl.LLM) -> float:
    with agl.workspace(task["files"]) as ws:
        home = agl.agent_home(ws)  # its history, caches and settings in a private home outside the workspace
        model = f"openai/{llm.model}"  # LiteLLM's OpenAI client, at OPENAI_API_BASE: the attempt's URL
        # Aider downloads LiteLLM's price list from GitHub to size a model it has no data for; one given in a
        # metadata file is taken as it is (aider/models.py, ModelInfoManager), so it contacts no host but agl
        metadata = home / "model-metadata.json"
        info = {"max_input_tokens": 32768, "max_output_tokens": 4096, "litellm_provider": "openai", "mode": "chat"}
        metadata.write_text(json.dumps({model: info | {"input_cost_per_token": 0, "output_cost_per_token": 0}}))
        history = home / "chat-history.md"  # its record of the run: replies, edits, test failures (read below)
        argv = [aider_command(), "--model", model, "--model-metadata-file", str(metadata), *FLAGS]
        argv += ["--chat-history-file", str(history), "--input-history-file", str(home / "input-history")]
        argv += ["--edit-format", task.get("edit_format", "diff")]
        argv += ["--test-cmd", task["test"], "--auto-test", "--message", task["prompt"], *task.get("edit", [])]
        agl.run_cli(argv, llm=llm, agent="aider", cwd=ws, env=QUIET, timeout_s=task.get("timeout_s", 600))
        agl.record_tool_runs(history, "aider", agent="aider")  # its edits and test runs as tool spans (AIR)
        tests = agl.run_sandboxed(["sh", "-c", task["test"]], cwd=ws, timeout_s=120)  # model-written code: confined
        return 1.0 if tests.returncode == 0 else 0.0
