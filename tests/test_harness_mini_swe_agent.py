"""mini-swe-agent as an unchanged rollout (issue #44): the pinned `mini` (in .venv-harness, apart from agl's .venv)
runs headless in a fresh workspace under real `agl serve` + `agl worker`, against the scripted upstream whose
`agl-step:` lines make the model call mini-swe-agent's own `bash` tool: read the file, edit it, run the test, then
the command that submits. mini executes each command itself: the file is repaired, the task's test passes, and
every model call (LiteLLM's OpenAI client) is stored under `mini-swe-agent` with exact ids, as many as mini made."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from agl.client import Client
from agl.common import hermes
from agl.common.processes import ServerProcess
from agl.testing.fixtures import wait_rollouts
from agl.testing.upstream import encode, step_line
from tests.harness_support import TEST_COMMAND, assert_stored_exactly, assert_tool_runs, defective_calc

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "coding-agents" / "mini_swe_agent.py"
MINI = Path(os.environ.get("AGL_MINI_SWE_AGENT") or REPO / ".venv-harness" / "bin" / "mini")
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"  # mini's own finish: a command printing this first


@pytest.fixture(autouse=True)
def mini_swe_agent_installed() -> None:
    if not MINI.exists():
        pytest.fail(f"mini-swe-agent is not installed at {MINI}: `make harnesses` builds .venv-harness with it")


def test_mini_swe_agent_repairs_a_file_with_its_own_commands_and_every_call_is_stored_exactly(
    agl_server: ServerProcess, agl_client: Client, agl_workers: Any, tmp_path: Path
) -> None:
    files = defective_calc(tmp_path)
    commands = [TEST_COMMAND, "cat calc.py", "sed -i 's/a - b/a + b/' calc.py", TEST_COMMAND, SUBMIT]
    # the model's turns, in mini's own format: one call of its `bash` tool each; mini puts the task in its first
    # user message, where the scripted model reads these lines
    prompt = "Fix calc.py so that add() adds; check.py is its test.\n" + "".join(
        step_line("bash", {"command": c}) for c in commands
    )
    trajectory = tmp_path / "trajectory.json"  # mini's own record of the run, kept outside the workspace
    task = {"files": str(files), "prompt": prompt, "test": TEST_COMMAND, "trajectory": str(trajectory)}
    (rollout,) = agl_client.enqueue(task)
    agl_workers(f"{EXAMPLE}:repair", agl_server.url)
    (done,) = wait_rollouts(agl_client, [rollout.id], timeout=180)
    detail = agl_client.rollout_detail(rollout.id)
    (span,) = [s for s in detail.spans if s.name.startswith("cli:")]
    tail = span.attributes.get("cli.output_tail")
    assert done.status.value == "succeeded", tail
    assert detail.rollout.final_reward == 1.0, tail  # mini's own `sed` fixed it
    assert span.status.value == "ok" and span.agent_name == "mini-swe-agent", tail

    calls = sorted(detail.llm_calls, key=lambda c: c.seq)
    assert len(calls) == len(commands)  # one call per turn, nothing else sent
    assert_stored_exactly(calls, "mini-swe-agent", "chat")  # the test's output back in the last prompt too
    for call, command in zip(calls, commands, strict=True):
        assert [t["function"]["name"] for t in call.request["tools"]] == ["bash"]
        (tool_call,) = call.response_message["tool_calls"]  # type: ignore[index]
        assert json.loads(tool_call["function"]["arguments"]) == {"command": command}
        assert call.response_ids == encode(hermes.render_tool_call("bash", tool_call["function"]["arguments"]))

    # no call went around agl: mini counted as many model calls as agl stored, and it ended by submitting
    saved = json.loads(trajectory.read_text())
    assert saved["info"]["model_stats"]["api_calls"] == len(calls)
    assert saved["info"]["exit_status"] == "Submitted"
    assert not detail.rollout.bypassed_llm_calls
    # and its process tree connected to no other host (agl.capture.egress counts them)
    assert span.attributes["cli.egress"] == []
    # its commands from its trajectory, each placed by its call id: the failing test run penalised, its submission
    # (not executed, mini says) neither ok nor failed
    assert_tool_runs(
        detail, [(0, "bash", "error"), (1, "bash", "ok"), (2, "bash", "ok"), (3, "bash", "ok"), (4, "bash", "unset")]
    )
