"""Claude Code as an unchanged rollout (issue #44): the pinned `claude` from npm runs headless (`claude -p`) in a
fresh workspace under real `agl serve` + `agl worker`, against the scripted upstream whose `agl-step:` lines make the
model issue Claude Code's own tool calls (Read, Edit, Bash) and finish. Claude Code executes them itself: the file
is repaired, the task's test passes, and every model call is stored through the Messages route under `claude-code`
with exact ids."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from agl.client import Client
from agl.common.processes import ServerProcess
from agl.testing.fixtures import wait_rollouts
from agl.testing.upstream import encode, render_prompt

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "coding-agents"
CLAUDE = Path(os.environ.get("AGL_CLAUDE_CODE") or EXAMPLES / "node_modules" / ".bin" / "claude")


@pytest.fixture(autouse=True)
def claude_code_installed() -> None:
    if not CLAUDE.exists():
        pytest.fail(f"Claude Code is not installed at {CLAUDE}: `make harnesses` installs the pinned one")


def step(name: str, arguments: dict[str, Any]) -> str:
    return f"agl-step: {name} {json.dumps(arguments)}\n"


def test_claude_code_repairs_a_file_with_its_own_tools_and_every_call_is_stored_exactly(
    agl_server: ServerProcess, agl_client: Client, agl_workers: Any, tmp_path: Path
) -> None:
    files = tmp_path / "task-files"
    files.mkdir()
    (files / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (files / "check.py").write_text("import calc\n\nassert calc.add(2, 3) == 5, calc.add(2, 3)\nprint('tests pass')\n")
    # the model's turns, in Claude Code's own tools; paths are relative to the workspace, which Claude Code resolves
    prompt = (
        "Fix calc.py so that add() adds; check.py is its test.\n"
        + step("Read", {"file_path": "calc.py"})
        + step("Edit", {"file_path": "calc.py", "old_string": "a - b", "new_string": "a + b"})
        + step("Bash", {"command": "python3 check.py", "description": "Run the test"})
        + 'agl-step: say "Fixed: add() returns a + b and check.py passes."\n'
    )
    (rollout,) = agl_client.enqueue({"files": str(files), "prompt": prompt, "test": "python3 check.py"})
    agl_workers(f"{EXAMPLES / 'claude_code.py'}:repair", agl_server.url)
    (done,) = wait_rollouts(agl_client, [rollout.id], timeout=180)
    detail = agl_client.rollout_detail(rollout.id)
    (span,) = [s for s in detail.spans if s.name.startswith("cli:")]
    assert done.status.value == "succeeded", span.attributes.get("cli.output_tail")
    assert detail.rollout.final_reward == 1.0, span.attributes.get("cli.output_tail")  # Claude Code's edit fixed it

    calls = sorted(detail.llm_calls, key=lambda c: c.seq)
    assert len(calls) == 4  # read, edit, run the test, finish: one call per turn, nothing else sent
    for call in calls:
        assert call.agent_name == "claude-code" and call.route == "messages" and call.trainable
        assert call.prompt_ids == encode(render_prompt(call.request["messages"], call.request.get("tools")))
    tool_calls = [c.response_message["tool_calls"][0]["function"] for c in calls[:3]]  # type: ignore[index, call-overload]
    assert [t["name"] for t in tool_calls] == ["Read", "Edit", "Bash"]
    # each tool's result went back to the model: the Bash turn's prompt holds the test's output
    last_prompt = calls[3].request["messages"]
    assert any("tests pass" in str(m.get("content")) for m in last_prompt if m.get("role") == "tool")
    assert calls[3].response_ids == encode("Fixed: add() returns a + b and check.py passes.")
    assert span.status.value == "ok" and span.agent_name == "claude-code"
    # nothing else reached: every connection of its process tree through the proxy variables is counted
    assert span.attributes["cli.egress"] == [] and detail.rollout.bypassed_llm_calls == 0
