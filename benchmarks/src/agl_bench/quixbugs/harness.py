"""QuixBugs through a coding harness as it ships: mini-swe-agent, a program of its own, repairs the program's file in
a fresh workspace with its own `bash` tool; the file as it leaves it is scored by the program's tests.

    agl bench train quixbugs --set harness=mini-swe-agent --agents mini-swe-agent

Every model call it makes is stored under the agent `mini-swe-agent` (its URL names it: agl's HTTP hook is not in
that process). mini-swe-agent comes from `.venv-harness` (`make harnesses`), or AGL_MINI_SWE_AGENT, or PATH.

Task options (beside the task's own keys): `harness` ("mini-swe-agent"), `harness_steps` (its step limit, default
8), `max_tokens` (per call, default 768), `harness_timeout_s` (default 600), `harness_prompt` (a template with
{program}, {file}, {description}: replaces the instructions; tests put scripted-model directives here), `sandbox`
("bwrap", the default: mini-swe-agent and the tests in agl's sandbox; "none": both bare, the opt-out).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import agl

HARNESS_AGENTS = {"mini-swe-agent": "mini-swe-agent"}  # harness → the agent name its calls are stored under
PROMPT = (
    "The Python program {file} in the current directory has a bug on exactly one line.\n{description}\n"
    "Fix the bug by editing {file} in place, keeping the function's name and arguments. When it is fixed, finish."
)
# mini-swe-agent's documented switches for a run nobody watches, with a model LiteLLM has no price for (see
# examples/coding-agents/mini_swe_agent.py): no set-up prompt, no banner, cost errors ignored, no price list fetched
QUIET = {
    "MSWEA_CONFIGURED": "true",
    "MSWEA_SILENT_STARTUP": "1",
    "MSWEA_COST_TRACKING": "ignore_errors",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
}


def mini_command() -> str:
    """`mini`: AGL_MINI_SWE_AGENT, else `.venv-harness/bin/mini` above the working folder or this file, else PATH."""
    if os.environ.get("AGL_MINI_SWE_AGENT"):
        return os.environ["AGL_MINI_SWE_AGENT"]
    for start in (Path.cwd(), Path(__file__).resolve()):
        for folder in (start, *start.parents):
            if (found := folder / ".venv-harness" / "bin" / "mini").exists():
                return str(found)
    if found_on_path := shutil.which("mini"):
        return found_on_path
    raise FileNotFoundError("mini-swe-agent not found (.venv-harness, AGL_MINI_SWE_AGENT, PATH): `make harnesses`")


def repair_with_harness(task: dict[str, Any], llm: agl.LLM) -> tuple[str, agl.CliResult]:
    """Run the task's harness on its program in a fresh workspace: (the program's source as it left it, the run)."""
    harness = task["harness"]
    if harness not in HARNESS_AGENTS:
        raise ValueError(f"unknown harness {harness!r}; known: {', '.join(HARNESS_AGENTS)}")
    file = f"{task['program']}.py"
    template = str(task.get("harness_prompt") or PROMPT)
    # replaced, not str.format: a template may hold JSON (a scripted model's directives), braces and all
    fields = {"{program}": str(task["program"]), "{file}": file, "{description}": str(task.get("description") or "")}
    prompt = template
    for field, value in fields.items():
        prompt = prompt.replace(field, value)
    with agl.workspace() as ws:
        (ws / file).write_text(str(task["source"]))
        mini = agl.agent_home(ws) / ".mini"  # its config and trajectory outside the workspace
        argv = [mini_command(), "-t", prompt, "--yolo", "--exit-immediately", "-l", "0", "-o", str(mini / "run.json")]
        argv += [
            "-m",
            f"openai/{llm.model}",
            "-c",
            "mini.yaml",
            "-c",
            f"agent.step_limit={task.get('harness_steps', 8)}",
        ]
        argv += ["-c", f"model.model_kwargs.max_tokens={int(task.get('max_tokens') or 768)}"]
        env = {**QUIET, "MSWEA_GLOBAL_CONFIG_DIR": str(mini)}
        timeout_s = float(task.get("harness_timeout_s") or 600)
        agent = HARNESS_AGENTS[harness]
        sandbox = task.get("sandbox")  # None: agl's default sandbox
        done = agl.run_cli(argv, llm=llm, agent=agent, cwd=ws, env=env, timeout_s=timeout_s, sandbox=sandbox)
        # its commands as tool spans, each placed after the call that asked for it (AIR's tool rule reads them)
        agl.record_tool_runs(mini / "run.json", "mini-swe-agent", agent=HARNESS_AGENTS[harness])
        try:  # the file as the agent left it: a link it made in its place is not followed out
            source = agl.read_agent_file(ws / file).decode(errors="replace")
        except (OSError, ValueError) as exc:
            source = f"# the agent left no readable {file}: {exc}\n"
        return source, done
