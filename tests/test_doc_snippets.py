"""Snippets of the documentation site and the READMEs that are run, not only checked (tests/test_readme_commands.py
parses every `agl` line and compiles every Python block).

A block is run when an HTML comment right before it says how (invisible on the rendered page):

- `<!-- test: rollout {"tasks": [...], "rewards": [...], "agent": "name"} -->` before a Python block: the block is
  executed as a module, and each rollout function it defines runs each task through a real `agl serve` with the
  scripted upstream (which answers "Echo: <the question>"); each rollout must succeed with the reward given, and
  its LLM calls must be stored under the agent named.
- `<!-- test: inspect -->` before a bash block: after those rollouts, each `agl` line runs against the same server
  (a rollout id in the line becomes one that exists) and must exit 0.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from agl.capture.decorator import RolloutFunction
from agl.client import Client
from agl.common.processes import ServerProcess
from agl.testing.fixtures import run_one

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted([*REPO.glob("docs/**/*.md"), REPO / "README.md", *REPO.glob("packages/*/README.md")])
MARKED = re.compile(r"<!-- test: (\w+)(.*?)-->\n```(\w+)[^\n]*\n(.*?)^```", re.M | re.S)
AGL = str(Path(sys.executable).with_name("agl"))


def marked(kind: str) -> list[tuple[str, dict[str, Any], str]]:
    """(where, options, code) of every block marked `kind`."""
    out = []
    for page in PAGES:
        text = page.read_text()
        for match in MARKED.finditer(text):
            if match.group(1) == kind:
                where = f"{page.relative_to(REPO)}:{text[: match.start()].count(chr(10)) + 1}"
                options = json.loads(match.group(2)) if match.group(2).strip() else {}
                out.append((where, options, match.group(4)))
    return out


def test_the_docs_mark_snippets_to_run() -> None:
    assert marked("rollout") and marked("inspect")


def rollout_functions(code: str, where: str) -> list[RolloutFunction]:
    module = types.ModuleType(f"snippet_{abs(hash(where))}")
    exec(compile(code, where, "exec"), module.__dict__)
    found = [v for v in vars(module).values() if isinstance(v, RolloutFunction)]
    assert found, f"{where}: the block defines no @agl.rollout function"
    return found


@pytest.mark.parametrize(("where", "options", "code"), marked("rollout"), ids=lambda v: str(v)[:40])
def test_a_rollout_snippet_runs_and_earns_its_rewards(
    where: str, options: dict[str, Any], code: str, server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    rollout_ids = []
    for app in rollout_functions(code, where):
        for task, reward in zip(options["tasks"], options["rewards"], strict=True):
            detail = run_one(app, server, client, task)
            assert detail.rollout.final_reward == pytest.approx(reward), (where, task, detail.rollout.final_reward)
            assert detail.llm_calls and {c.agent_name for c in detail.llm_calls} == {options["agent"]}
            assert all(c.trainable for c in detail.llm_calls), [c.not_trainable_reason for c in detail.llm_calls]
            rollout_ids.append(detail.rollout.id)
    for inspect_where, _, block in marked("inspect"):
        for line in block.splitlines():
            command = line.split(" #", 1)[0].strip()
            if not command:
                continue
            words = [re.sub(r"^ro-[0-9a-f]+$", rollout_ids[0], w) for w in shlex.split(command)]
            assert words[0] == "agl", (inspect_where, command)
            done = subprocess.run(
                [AGL, *words[1:]],
                cwd=tmp_path,
                env={**_env(), "AGL_SERVER_URL": server.url},
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, (inspect_where, command, done.stderr[-2000:])
    exported = tmp_path / "calls.jsonl"
    if any("--output calls.jsonl" in block for _, _, block in marked("inspect")):
        # `agl export --output calls.jsonl`: every trained call, token ids included
        rows = [json.loads(line) for line in exported.read_text().splitlines()]
        assert len(rows) == len(rollout_ids) and all(r["prompt_ids"] and r["response_ids"] for r in rows)


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "AGL_SERVER_URL"}
