"""Claude Code as an unchanged rollout (issue #44): the pinned `claude` from npm runs headless (`claude -p`) in a
fresh workspace under real `agl serve` + `agl worker`, against the scripted upstream whose `agl-step:` lines make the
model issue Claude Code's own tool calls (Read, Edit, Bash) and finish. Claude Code executes them itself: the file
is repaired (by a sub-agent it delegates to), the task's test passes, and every model call is stored through the
Messages route with exact ids, under `claude-code` or, the sub-agent's, `claude-code/subagent`; its tool runs are read
back from its event stream for AIR."""

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
EDITED = "Edited calc.py: add() returns a + b."  # the sub-agent's report
CLAUDE = Path(os.environ.get("AGL_CLAUDE_CODE") or EXAMPLES / "node_modules" / ".bin" / "claude")


@pytest.fixture(autouse=True)
def claude_code_installed() -> None:
    if not CLAUDE.exists():
        pytest.fail(f"Claude Code is not installed at {CLAUDE}: `make harnesses` installs the pinned one")


def test_claude_code_repairs_a_file_with_its_own_tools_and_every_call_is_stored_exactly(
    agl_server: ServerProcess, agl_client: Client, agl_workers: Any, tmp_path: Path
) -> None:
    files = defective_calc(tmp_path)
    # the model's turns, in Claude Code's own tools; paths are relative to the workspace, which Claude Code resolves.
    # The edit is delegated to a sub-agent (its `Agent` tool, run in the foreground), whose own turns its prompt
    # scripts: its calls carry Claude Code's sub-agent header, and agl stores them under `claude-code/subagent`
    sub_agent_turns = step_line("Edit", {"file_path": "calc.py", "old_string": "a - b", "new_string": "a + b"})
    sub_agent_turns += say_line(EDITED)
    delegate = {"description": "Fix add", "prompt": "Fix add() in calc.py.\n" + sub_agent_turns}
    delegate |= {"subagent_type": "general-purpose", "run_in_background": False}
    prompt = (
        "Fix calc.py so that add() adds; check.py is its test.\n"
        + step_line("Bash", {"command": TEST_COMMAND, "description": "Run the test"})  # fails before the fix
        + step_line("Read", {"file_path": "calc.py"})
        + step_line("Agent", delegate)
        + step_line("Bash", {"command": TEST_COMMAND, "description": "Run the test"})
        + say_line(FIXED_ANSWER)
    )
    (rollout,) = agl_client.enqueue({"files": str(files), "prompt": prompt, "test": TEST_COMMAND})
    agl_workers(f"{EXAMPLES / 'claude_code.py'}:repair", agl_server.url)
    (done,) = wait_rollouts(agl_client, [rollout.id], timeout=180)
    detail = agl_client.rollout_detail(rollout.id)
    (span,) = [s for s in detail.spans if s.name.startswith("cli:")]
    assert done.status.value == "succeeded", span.attributes.get("cli.output_tail")
    assert detail.rollout.final_reward == 1.0, span.attributes.get("cli.output_tail")  # the sub-agent's edit fixed it

    calls = sorted(detail.llm_calls, key=lambda c: c.seq)
    # one call per turn, nothing else sent: its own five, and between its third and fourth the sub-agent's two
    assert [c.agent_name for c in calls] == ["claude-code"] * 3 + ["claude-code/subagent"] * 2 + ["claude-code"] * 2
    own = [c for c in calls if c.agent_name == "claude-code"]
    assert_stored_exactly(own, "claude-code", "messages")
    assert_stored_exactly(calls[3:5], "claude-code/subagent", "messages", tests_ran=False)
    tool_calls = [c.response_message["tool_calls"][0]["function"]["name"] for c in calls[:4] + calls[5:6]]  # type: ignore[index, call-overload]
    assert tool_calls == ["Bash", "Read", "Agent", "Edit", "Bash"]
    assert calls[4].response_ids == encode(EDITED) and calls[6].response_ids == encode(FIXED_ANSWER)
    # the sub-agent's report went back to the harness's own model as the Agent tool's result
    assert any(EDITED in str(m.get("content")) for m in calls[5].request["messages"] if m["role"] == "tool")
    # its runs from its stream-json events, each placed by its call id (the sub-agent's Edit after the sub-agent's
    # call, its Agent run after the call that delegated): the failing test penalised
    assert_tool_runs(
        detail, [(0, "Bash", "error"), (1, "Read", "ok"), (2, "Agent", "ok"), (3, "Edit", "ok"), (5, "Bash", "ok")]
    )
    assert [s.agent_name for s in detail.spans if s.name == "Edit"] == ["claude-code/subagent"]
    assert span.status.value == "ok" and span.agent_name == "claude-code"
    # nothing else reached: every connection of its process tree through the proxy variables is counted
    assert span.attributes["cli.egress"] == [] and detail.rollout.bypassed_llm_calls == 0
