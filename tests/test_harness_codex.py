"""OpenAI's Codex CLI as an unchanged rollout (issue #44): the pinned `codex` from npm runs headless (`codex exec`)
in a fresh workspace under real `agl serve` + `agl worker`, against the scripted upstream whose `agl-step:` lines
make the model issue Codex's own tool calls (exec_command: read the file, apply_patch, run the test) and finish.
Codex executes them itself: the file is repaired, the task's test passes, and every model call is stored through
the Responses route under `codex` with exact ids, with no connection to any host but agl."""

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
CODEX = Path(os.environ.get("AGL_CODEX") or EXAMPLES / "node_modules" / ".bin" / "codex")


@pytest.fixture(autouse=True)
def codex_installed() -> None:
    if not CODEX.exists():
        pytest.fail(f"Codex is not installed at {CODEX}: `make harnesses` installs the pinned one")


PATCH = "apply_patch <<'EOF'\n*** Begin Patch\n*** Update File: calc.py\n@@\n-    return a - b\n+    return a + b\n*** End Patch\nEOF\n"


def test_codex_repairs_a_file_with_its_own_tools_and_every_call_is_stored_exactly(
    agl_server: ServerProcess, agl_client: Client, agl_workers: Any, tmp_path: Path
) -> None:
    files = defective_calc(tmp_path)
    # the model's turns, in Codex's own tool: exec_command runs a shell command in the workspace, and an
    # `apply_patch` command there is Codex's file edit (its instructions tell the model so)
    prompt = (
        "Fix calc.py so that add() adds; check.py is its test.\n"
        + step_line("exec_command", {"cmd": TEST_COMMAND})  # fails before the fix: AIR's penalty goes here
        + step_line("exec_command", {"cmd": "cat calc.py"})
        + step_line("exec_command", {"cmd": PATCH})
        + step_line("exec_command", {"cmd": TEST_COMMAND})
        + say_line(FIXED_ANSWER)
    )
    (rollout,) = agl_client.enqueue({"files": str(files), "prompt": prompt, "test": TEST_COMMAND})
    agl_workers(f"{EXAMPLES / 'codex_cli.py'}:repair", agl_server.url)
    (done,) = wait_rollouts(agl_client, [rollout.id], timeout=180)
    detail = agl_client.rollout_detail(rollout.id)
    (span,) = [s for s in detail.spans if s.name.startswith("cli:")]
    assert done.status.value == "succeeded", span.attributes.get("cli.output_tail")
    assert detail.rollout.final_reward == 1.0, span.attributes.get("cli.output_tail")  # Codex's patch fixed it

    calls = sorted(detail.llm_calls, key=lambda c: c.seq)
    assert len(calls) == 5  # test, read, edit, test again, finish: one call per turn, nothing else sent
    assert_stored_exactly(calls, "codex", "responses")
    tool_calls = [c.response_message["tool_calls"][0]["function"] for c in calls[:4]]  # type: ignore[index, call-overload]
    assert [t["name"] for t in tool_calls] == ["exec_command"] * 4
    # each command's output went back to the model: the file's text, then the test's output
    assert any("return a - b" in str(m.get("content")) for m in calls[2].request["messages"] if m["role"] == "tool")
    assert calls[4].response_ids == encode(FIXED_ANSWER)
    # its runs from `codex exec --json`, placed by order (it reports no call id): the failing test, the read, the
    # patch (run through exec_command, reported as a file change), the passing test
    assert_tool_runs(
        detail,
        [
            (0, "command_execution", "error"),
            (1, "command_execution", "ok"),
            (2, "file_change", "ok"),
            (3, "command_execution", "ok"),
        ],
    )
    assert span.status.value == "ok" and span.agent_name == "codex"
    assert span.attributes.get("cli.egress") == [], span.attributes.get(
        "cli.egress"
    )  # no analytics, feedback or update check reached any host
