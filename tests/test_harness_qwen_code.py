"""Qwen Code as an unchanged rollout (issue #55): the pinned `qwen` from npm runs headless (one-shot, `--yolo`,
`--output-format stream-json`) in a fresh workspace under real `agl serve` + `agl worker`, against the scripted
upstream whose `agl-step:` lines make the model issue Qwen Code's own tool calls (run_shell_command, agent) and
finish. Qwen Code executes them itself: the file is repaired (by a sub-agent it delegates to), the task's test
passes, and every model call is stored through the chat route under `qwen-code` with exact ids: its sub-agent's
too, since Qwen Code marks them in no header nor field (only their system prompt differs); its tool runs, with
their exit codes read from its results' text, are read back from its event stream for AIR."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from agl.client import Client
from agl.common.attributes import TOOL_EXIT_CODE
from agl.common.processes import ServerProcess
from agl.testing.fixtures import wait_rollouts
from agl.testing.upstream import encode, say_line, step_line
from tests.harness_support import FIXED_ANSWER, TEST_COMMAND, assert_stored_exactly, assert_tool_runs, defective_calc

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "coding-agents"
QWEN = Path(os.environ.get("AGL_QWEN_CODE") or EXAMPLES / "qwen-code" / "node_modules" / ".bin" / "qwen")
EDITED = "Edited calc.py: add() returns a + b."  # the sub-agent's report
FIX = (
    "python3 -c \"import pathlib; p = pathlib.Path('calc.py'); p.write_text(p.read_text().replace('a - b', 'a + b'))\""
)
SUB_AGENT_SYSTEM = "You are a general-purpose subagent"  # how its sub-agent's requests differ: their system prompt


@pytest.fixture(autouse=True)
def qwen_code_installed() -> None:
    if not QWEN.exists():
        pytest.fail(f"Qwen Code is not installed at {QWEN}: `make harnesses` installs the pinned one")


def test_qwen_code_repairs_a_file_with_its_own_tools_and_every_call_is_stored_exactly(
    agl_server: ServerProcess, agl_client: Client, agl_workers: Any, tmp_path: Path
) -> None:
    files = defective_calc(tmp_path)
    # the edit is delegated to a sub-agent (its `agent` tool, in the foreground), whose own turns its prompt scripts:
    # an edit by a Python one-liner (Qwen Code's `edit` and `read_file` take absolute paths only, which the script
    # cannot know, and it refuses a `sed -i` of a file not read first), then its report
    sub_agent_turns = step_line("run_shell_command", {"command": FIX})
    sub_agent_turns += say_line(EDITED)
    delegate: dict[str, Any] = {"description": "Fix add", "prompt": "Fix add() in calc.py.\n" + sub_agent_turns}
    delegate |= {"subagent_type": "general-purpose", "run_in_background": False}
    prompt = (
        "Fix calc.py so that add() adds; check.py is its test.\n"
        + step_line("run_shell_command", {"command": TEST_COMMAND})  # fails before the fix
        + step_line("agent", delegate)
        + step_line("run_shell_command", {"command": TEST_COMMAND})
        + say_line(FIXED_ANSWER)
    )
    (rollout,) = agl_client.enqueue({"files": str(files), "prompt": prompt, "test": TEST_COMMAND})
    agl_workers(f"{EXAMPLES / 'qwen_code.py'}:repair", agl_server.url)
    (done,) = wait_rollouts(agl_client, [rollout.id], timeout=180)
    detail = agl_client.rollout_detail(rollout.id)
    (span,) = [s for s in detail.spans if s.name.startswith("cli:")]
    tail = span.attributes.get("cli.output_tail")
    assert done.status.value == "succeeded", tail
    assert detail.rollout.final_reward == 1.0, tail  # the sub-agent's edit fixed it
    assert span.status.value == "ok" and span.agent_name == "qwen-code", tail

    calls = sorted(detail.llm_calls, key=lambda c: c.seq)
    # one call per turn, nothing else sent: its own four, and between its second and third the sub-agent's two,
    # all under `qwen-code` (nothing in the sub-agent's requests but its system prompt tells them apart)
    assert len(calls) == 6
    assert_stored_exactly(calls, "qwen-code", "chat")
    sub_agent = [i for i, c in enumerate(calls) if SUB_AGENT_SYSTEM in str(c.request["messages"][0].get("content"))]  # type: ignore[union-attr, index]
    assert sub_agent == [2, 3]
    tool_calls = [c.response_message["tool_calls"][0]["function"]["name"] for c in calls[:3] + calls[4:5]]  # type: ignore[index, call-overload]
    assert tool_calls == ["run_shell_command", "agent", "run_shell_command", "run_shell_command"]
    assert calls[3].response_ids == encode(EDITED) and calls[5].response_ids == encode(FIXED_ANSWER)
    # its runs from its stream-json events, each placed by its call id (the sub-agent's under `qwen-code` as its
    # calls are): the failing test penalised; the shell's exit codes read from its results' text, not -1
    assert_tool_runs(
        detail,
        [
            (0, "run_shell_command", "error"),
            (1, "agent", "ok"),
            (2, "run_shell_command", "ok"),
            (4, "run_shell_command", "ok"),
        ],
    )
    shell = [s for s in detail.spans if s.name == "run_shell_command"]
    assert sorted(s.attributes[TOOL_EXIT_CODE] for s in shell) == [0, 0, 1]  # type: ignore[type-var]
    assert {s.agent_name for s in detail.spans if s.name != span.name} == {"qwen-code"}
    # nothing else reached: every connection of its process tree through the proxy variables is counted
    assert span.attributes["cli.egress"] == [] and detail.rollout.bypassed_llm_calls == 0
