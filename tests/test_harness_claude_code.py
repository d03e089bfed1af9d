"""Claude Code as an unchanged rollout (issue #44): the pinned `claude` from npm runs headless (`claude -p`) in a
fresh workspace under real `agl serve` + `agl worker`, against the scripted upstream whose `agl-step:` lines make the
model issue Claude Code's own tool calls (Read, Edit, Bash) and finish. Claude Code executes them itself: the file
is repaired, the task's test passes, and every model call is stored through the Messages route under `claude-code`
with exact ids."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from agl.client import Client
from agl.common.processes import ServerProcess
from agl.testing.fixtures import wait_rollouts
from agl.testing.upstream import encode, say_line, step_line
from tests.harness_support import FIXED_ANSWER, TEST_COMMAND, assert_stored_exactly, defective_calc

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "coding-agents"
CLAUDE = Path(os.environ.get("AGL_CLAUDE_CODE") or EXAMPLES / "node_modules" / ".bin" / "claude")


@pytest.fixture(autouse=True)
def claude_code_installed() -> None:
    if not CLAUDE.exists():
        pytest.fail(f"Claude Code is not installed at {CLAUDE}: `make harnesses` installs the pinned one")


def test_claude_code_repairs_a_file_with_its_own_tools_and_every_call_is_stored_exactly(
    agl_server: ServerProcess, agl_client: Client, agl_workers: Any, tmp_path: Path
) -> None:
    files = defective_calc(tmp_path)
    # the model's turns, in Claude Code's own tools; paths are relative to the workspace, which Claude Code resolves
    prompt = (
        "Fix calc.py so that add() adds; check.py is its test.\n"
        + step_line("Read", {"file_path": "calc.py"})
        + step_line("Edit", {"file_path": "calc.py", "old_string": "a - b", "new_string": "a + b"})
        + step_line("Bash", {"command": TEST_COMMAND, "description": "Run the test"})
        + say_line(FIXED_ANSWER)
    )
    (rollout,) = agl_client.enqueue({"files": str(files), "prompt": prompt, "test": TEST_COMMAND})
    agl_workers(f"{EXAMPLES / 'claude_code.py'}:repair", agl_server.url)
    (done,) = wait_rollouts(agl_client, [rollout.id], timeout=180)
    detail = agl_client.rollout_detail(rollout.id)
    (span,) = [s for s in detail.spans if s.name.startswith("cli:")]
    assert done.status.value == "succeeded", span.attributes.get("cli.output_tail")
    assert detail.rollout.final_reward == 1.0, span.attributes.get("cli.output_tail")  # Claude Code's edit fixed it

    calls = sorted(detail.llm_calls, key=lambda c: c.seq)
    assert len(calls) == 4  # read, edit, run the test, finish: one call per turn, nothing else sent
    assert_stored_exactly(calls, "claude-code", "messages")
    tool_calls = [c.response_message["tool_calls"][0]["function"] for c in calls[:3]]  # type: ignore[index, call-overload]
    assert [t["name"] for t in tool_calls] == ["Read", "Edit", "Bash"]
    # each tool's result went back to the model: the Bash turn's prompt holds the test's output
    assert calls[3].response_ids == encode(FIXED_ANSWER)
    assert span.status.value == "ok" and span.agent_name == "claude-code"
    # nothing else reached: every connection of its process tree through the proxy variables is counted
    assert span.attributes["cli.egress"] == [] and detail.rollout.bypassed_llm_calls == 0
