"""OpenAI's Codex CLI, unchanged, as a rollout: `codex exec` in a fresh copy of the task's files, its every model call
through agl's Responses route under the agent `codex` (a custom model provider at the attempt's URL), its
commands and file changes read back from its event stream as tool spans (AIR), the reward from the task's tests.

Task: {"files": folder to copy, "prompt": what to do, "test": shell command whose exit 0 means solved,
       "timeout_s": optional limit for Codex}.
Codex comes from npm (`make harnesses` installs the pinned one in examples/coding-agents/node_modules;
AGL_CODEX names another `codex`). Run: agl worker examples/coding-agents/codex_cli.py:repair
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import agl

PINNED = Path(__file__).with_name("node_modules") / ".bin" / "codex"
# Codex's documented config keys (developers.openai.com/codex/config-reference) for traffic other than the model's:
# no analytics, feedback uploads, OpenTelemetry exporters, update check, nor the start-up sync of OpenAI's plugin
# catalogue (github.com, chatgpt.com); no hosted web search, sub-agent or goal tools (not functions a chat model
# is trained on, and agl's Responses route serves function tools only)
QUIET = [
    "analytics.enabled=false",
    "feedback.enabled=false",
    'otel.exporter="none"',
    'otel.trace_exporter="none"',
    'otel.metrics_exporter="none"',
    "check_for_update_on_startup=false",
    "features.plugins=false",
    'web_search="disabled"',
    "features.multi_agent=false",
    "features.goals=false",
]


def codex_command() -> str:
    found = os.environ.get("AGL_CODEX") or (str(PINNED) if PINNED.exists() else shutil.which("codex"))
    if not found:
        raise FileNotFoundError(f"Codex not found at {PINNED} nor on PATH: `make harnesses` installs it")
    return found


@agl.rollout
def repair(task: dict[str, Any], llm: agl.LLM) -> float:
    with agl.workspace(task["files"]) as ws:
        # a model provider of its own at the attempt's URL, naming the agent; Codex speaks the Responses API to it
        provider = {"name": "agl", "base_url": llm.for_agent("codex").base_url, "env_key": "OPENAI_API_KEY"}
        provider["wire_api"] = "responses"
        # --json: its events as JSON lines, every command and file change with how it ended (read back for AIR)
        argv = [codex_command(), "exec", task["prompt"], "--json", "--skip-git-repo-check", "-m", llm.model]
        argv += ["-c", "model_provider=agl", "-c", f"model_providers.agl={_toml(provider)}"]
        # headless: never asks. Its own sandbox off: agl's confines it (only the workspace writable, no network but the
        # attempt's LLM), and Codex's bubblewrap cannot nest in it (agl's sandbox allows no further user namespaces);
        # Codex documents this switch for environments sandboxed from outside
        argv += ["--sandbox", "danger-full-access", "-c", 'approval_policy="never"']
        for setting in QUIET:
            argv += ["-c", setting]
        # its config, sessions and logs in the sandbox's private home, outside the workspace (its own ~/.codex)
        done = agl.run_cli(argv, llm=llm, agent="codex", cwd=ws, timeout_s=task.get("timeout_s", 600))
        agl.record_tool_runs(done, "codex", agent="codex")  # its commands and file changes as tool spans (AIR)
        tests = agl.run_sandboxed(["sh", "-c", task["test"]], cwd=ws, timeout_s=120)  # model-written code: confined
        return 1.0 if tests.returncode == 0 else 0.0


def _toml(table: dict[str, str]) -> str:
    """An inline TOML table (a JSON string is a TOML basic string)."""
    return "{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in table.items()) + "}"
