"""Command-line agents as rollouts (issue #44): `agl.run_cli` runs a program that knows nothing of agl in a fresh
`agl.workspace`, with the attempt's endpoint in its environment and its agent in the URL; through real `agl serve`
and `agl worker` processes against the scripted backend: its call stored under its agent with exact ids, its run as
a span with the output's tail, the workspace gone afterwards; on its time limit the whole process tree killed."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from agl.client import Client
from agl.common.processes import ServerProcess
from agl.learn.selection import AgentSelection
from agl.testing.fixtures import wait_rollouts
from agl.testing.upstream import encode, render_prompt

APP = str(Path(__file__).with_name("cli_apps.py")) + ":solve"


def task_files(tmp_path: Path) -> Path:
    """The task's folder the program reads its question from."""
    files = tmp_path / "task-files"
    files.mkdir()
    (files / "task.txt").write_text("What is 3 * 4?\n")
    return files


def test_a_cli_agent_runs_in_its_workspace_and_its_calls_are_its_own(
    agl_server: ServerProcess, agl_client: Client, agl_workers: Any, tmp_path: Path
) -> None:
    files = task_files(tmp_path)
    scratch = tmp_path / "tmp"  # the worker's temporary folder: every workspace is made there
    scratch.mkdir()
    beats = tmp_path / "beats"
    beats.mkdir()
    tasks = [{"files": str(files)}, {"files": str(files), "hang": True, "beats": str(beats), "timeout_s": 3}]
    ids = [r.id for task in tasks for r in agl_client.enqueue(task)]
    agl_workers(APP, agl_server.url, env={"TMPDIR": str(scratch)})
    done = wait_rollouts(agl_client, ids, timeout=120)
    assert [r.status.value for r in done] == ["succeeded", "succeeded"]
    answered, hung = (agl_client.rollout_detail(i) for i in ids)

    assert answered.rollout.final_reward == 1.0  # answered, exit 0, the output's tail kept
    (call,) = answered.llm_calls
    assert call.agent_name == "cli-agent" and call.trainable  # named by its URL: no agl in that process
    assert call.prompt_ids == encode(render_prompt(call.request["messages"], None))
    assert call.response_ids == encode("Echo: What is 3 * 4?")
    (span,) = [s for s in answered.spans if s.name.startswith("cli:")]
    assert span.status.value == "ok" and span.agent_name == "cli-agent"
    assert "asking: What is 3 * 4?" in str(span.attributes["cli.output_tail"])

    # the hung one: killed on its time limit, its child too; the rollout goes on and says so
    assert hung.rollout.final_reward == 0.0 and hung.llm_calls == []
    assert [r.value for r in hung.rewards if r.name == "timed_out"] == [1.0]
    (span,) = [s for s in hung.spans if s.name.startswith("cli:")]
    assert span.status.value == "error" and "timed out" in str(span.status_message)
    # the leader and its child (in a session of its own) both beat while it ran, and neither beats any more
    assert {p.name for p in beats.iterdir()} == {"leader", "child"}
    before = {p.name: p.read_text() for p in beats.iterdir()}
    time.sleep(1.0)
    assert {p.name: p.read_text() for p in beats.iterdir()} == before
    # every workspace (and the home and transcripts beside it) was deleted afterwards
    assert not [p for p in os.listdir(scratch) if p.startswith("agl-rollout-")]


def test_a_harness_s_sub_agents_are_stored_under_names_of_their_own(
    agl_server: ServerProcess, agl_client: Client, agl_workers: Any, tmp_path: Path
) -> None:
    # the program makes its own call, then one marked as Claude Code marks a sub-agent's, then one marked as Codex does
    files = task_files(tmp_path)
    (rollout,) = agl_client.enqueue({"files": str(files), "sub_agents": True})
    agl_workers(APP, agl_server.url)
    (done,) = wait_rollouts(agl_client, [rollout.id], timeout=120)
    assert done.status.value == "succeeded"
    calls = sorted(agl_client.rollout_detail(rollout.id).llm_calls, key=lambda c: c.seq)
    named = [(c.agent_name, c.request["messages"][-1]["content"]) for c in calls]  # type: ignore[index]
    assert named == [
        ("cli-agent", "What is 3 * 4?"),
        ("cli-agent/subagent", "as x-claude-code-agent-id"),
        ("cli-agent/review", "as x-openai-subagent"),
    ]
    # selectable apart: the harness's own turns, its sub-agents, or all of them
    for entry, selected in [
        ("cli-agent", ["cli-agent"]),
        ("cli-agent/subagent", ["cli-agent/subagent"]),
        ("cli-agent*", ["cli-agent", "cli-agent/subagent", "cli-agent/review"]),
    ]:
        assert [c.agent_name for c in calls if AgentSelection.parse(entry).selects(c.agent_name)] == selected
