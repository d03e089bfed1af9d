"""OpenCode as an unchanged rollout (issue #44): the pinned `opencode` from npm runs headless (`opencode run`) in a
fresh workspace under real `agl serve` + `agl worker`, against the scripted upstream whose `agl-step:` lines (in the
task's AGENTS.md, which OpenCode puts in its system message) make the model issue OpenCode's own tool calls (read,
edit, bash) and finish. OpenCode executes them itself: the file is repaired, the task's test passes, and every model
call is stored through the chat route under `opencode` with exact ids, with no connection to any host but agl."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from agl.client import Client
from agl.common.processes import ServerProcess
from agl.testing.fixtures import wait_rollouts
from agl.testing.upstream import encode, say_line, step_line
from tests.harness_support import FIXED_ANSWER, TEST_COMMAND, assert_stored_exactly, assert_tool_runs, defective_calc

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "coding-agents"
PINNED = EXAMPLES / "opencode" / "node_modules" / "opencode-linux-x64" / "bin" / "opencode"
OPENCODE = Path(os.environ.get("AGL_OPENCODE") or PINNED)


@pytest.fixture(autouse=True)
def opencode_installed() -> None:
    if not OPENCODE.exists():
        pytest.fail(f"OpenCode is not installed at {OPENCODE}: `make harnesses` installs the pinned one")


def test_opencode_repairs_a_file_with_its_own_tools_and_every_call_is_stored_exactly(
    agl_server: ServerProcess, agl_client: Client, agl_workers: Any, tmp_path: Path
) -> None:
    files = defective_calc(tmp_path)
    # the model's turns, in OpenCode's own tools (paths relative to the workspace), scripted in the project's
    # instructions: OpenCode quotes a prompt argument, so JSON in the prompt would reach the model escaped
    (files / "AGENTS.md").write_text(
        "# Project notes\n"
        + step_line("bash", {"command": TEST_COMMAND, "description": "Run the test"})  # fails before the fix
        + step_line("read", {"filePath": "calc.py"})
        + step_line("edit", {"filePath": "calc.py", "oldString": "a - b", "newString": "a + b"})
        + step_line("bash", {"command": TEST_COMMAND, "description": "Run the test"})
        + say_line(FIXED_ANSWER)
    )
    prompt = 'Fix calc.py so that add() adds; "check.py" is its test.'
    (rollout,) = agl_client.enqueue({"files": str(files), "prompt": prompt, "test": TEST_COMMAND})
    agl_workers(f"{EXAMPLES / 'opencode.py'}:repair", agl_server.url)
    (done,) = wait_rollouts(agl_client, [rollout.id], timeout=180)
    detail = agl_client.rollout_detail(rollout.id)
    (span,) = [s for s in detail.spans if s.name.startswith("cli:")]
    assert done.status.value == "succeeded", span.attributes.get("cli.output_tail")
    assert detail.rollout.final_reward == 1.0, span.attributes.get("cli.output_tail")  # OpenCode's edit fixed it

    calls = sorted(detail.llm_calls, key=lambda c: c.seq)
    assert len(calls) == 5  # test, read, edit, test again, finish: one call per turn, no title or other call
    assert_stored_exactly(calls, "opencode", "chat")
    # the prompt, given on standard input, reaches the model as it is (as an argument OpenCode would quote it)
    first_user = next(m for m in calls[0].request["messages"] if m["role"] == "user")
    assert first_user["content"] == prompt
    tool_calls = [c.response_message["tool_calls"][0]["function"] for c in calls[:4]]  # type: ignore[index, call-overload]
    assert [t["name"] for t in tool_calls] == ["bash", "read", "edit", "bash"]
    # each tool's output went back to the model: the file's text, then the test's output
    assert any("return a - b" in str(m.get("content")) for m in calls[2].request["messages"] if m["role"] == "tool")
    assert calls[4].response_ids == encode(FIXED_ANSWER)
    # its runs from `opencode run --format json`, each placed by its call id
    assert_tool_runs(detail, [(0, "bash", "error"), (1, "read", "ok"), (2, "edit", "ok"), (3, "bash", "ok")])
    assert span.status.value == "ok" and span.agent_name == "opencode"
    # no update check, model catalogue, plugin install or share reached any host
    assert span.attributes.get("cli.egress") == [], span.attributes.get("cli.egress")
