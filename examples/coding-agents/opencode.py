"""OpenCode, unchanged, as a rollout: `opencode run` in a fresh copy of the task's files, its every model call
through agl's chat-completions route under the agent `opencode` (an OpenAI-compatible provider at the attempt's
URL, in a config of the rollout's own), its tool runs read back from its event stream as tool spans (AIR), the
reward from the task's tests.

Task: {"files": folder to copy, "prompt": what to do, "test": shell command whose exit 0 means solved,
       "timeout_s": optional limit for OpenCode}.
The prompt goes on standard input, which `opencode run` reads as the message: as an argument, OpenCode would wrap it
in double quotes (escaping those inside) before sending it, and the model would be trained on the quoted text.
Project instructions in the task's files (AGENTS.md) reach the model in OpenCode's system message.
OpenCode comes from npm (`make harnesses` installs its pinned Linux x64 build in examples/coding-agents/opencode/;
AGL_OPENCODE names another `opencode`). Run: agl worker examples/coding-agents/opencode.py:repair
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import agl

PINNED = Path(__file__).with_name("opencode") / "node_modules" / "opencode-linux-x64" / "bin" / "opencode"
# OpenCode's switches (opencode.ai/docs/cli, "Environment variables"; opencode.ai/docs/config) for traffic other
# than the model's: no update check, no models.dev catalogue, no language-server downloads, no session sharing
QUIET = {
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_SHARE": "1",
}


def opencode_command() -> str:
    found = os.environ.get("AGL_OPENCODE") or (str(PINNED) if PINNED.exists() else shutil.which("opencode"))
    if not found:
        raise FileNotFoundError(f"OpenCode not found at {PINNED} nor on PATH: `make harnesses` installs it")
    return found


@agl.rollout
def repair(task: dict[str, Any], llm: agl.LLM) -> float:
    with agl.workspace(task["files"]) as ws:
        home = agl.agent_home(ws)  # its config, sessions, caches and logs in a private home outside the workspace
        provider = {"npm": "@ai-sdk/openai-compatible", "name": "agl", "models": {llm.model: {"tool_call": True}}}
        provider["options"] = {"baseURL": llm.for_agent("opencode").base_url, "apiKey": "{env:OPENAI_API_KEY}"}
        config = {"provider": {"agl": provider}, "model": f"agl/{llm.model}", "autoupdate": False, "share": "disabled"}
        config["permission"] = {"edit": "allow", "bash": "allow", "webfetch": "deny"}  # headless: never asks
        _config_dir(home / "config" / "opencode", config)
        env = {**QUIET} | {
            f"XDG_{kind}_HOME": str(home / kind.lower()) for kind in ("CONFIG", "DATA", "CACHE", "STATE")
        }
        env["PWD"] = str(ws)  # OpenCode takes its project folder from $PWD before its cwd; the worker's is not ws
        # --title: no extra model call to make one up; --pure: no external plugins; --format json: its events as JSON
        # lines, every tool run with how it ended (read back for AIR)
        argv = [opencode_command(), "run", "--title", "rollout", "--pure", "--format", "json"]
        timeout_s = task.get("timeout_s", 600)
        done = agl.run_cli(argv, llm=llm, agent="opencode", cwd=ws, env=env, stdin=task["prompt"], timeout_s=timeout_s)
        agl.record_tool_runs(done, "opencode", agent="opencode")  # its tool runs as tool spans (AIR)
        tests = agl.run_sandboxed(["sh", "-c", task["test"]], cwd=ws, timeout_s=120)  # model-written code: confined
        return 1.0 if tests.returncode == 0 else 0.0


def _config_dir(folder: Path, config: dict[str, Any]) -> None:
    """OpenCode's global config folder ($XDG_CONFIG_HOME/opencode) holding the rollout's opencode.json. OpenCode 1.18
    starts an npm install of @opencode-ai/plugin (the SDK for plugins users write; its own are built in) into each
    config folder, from registry.npmjs.org, with no switch to stop it; it skips a folder whose node_modules exists and
    whose package-lock.json lists that package (Npm.install in its packages/core/src/npm.ts). A rollout loads no
    plugins, so the folder says so, and OpenCode contacts no host but agl."""
    (folder / "node_modules").mkdir(parents=True)
    (folder / "opencode.json").write_text(json.dumps(config))
    lock = {"lockfileVersion": 3, "packages": {"": {"dependencies": {"@opencode-ai/plugin": "*"}}}}
    (folder / "package-lock.json").write_text(json.dumps(lock))
