"""Aider as an unchanged rollout (issue #55): the pinned `aider` (in .venv-aider, apart from agl's .venv) runs headless
(`--message`, `--yes-always`) in a fresh workspace under real `agl serve` + `agl worker`, against the scripted
upstream whose `agl-step:` lines make the model answer in Aider's own edit format (SEARCH/REPLACE blocks): an edit
that does not apply, one that applies but fails the test Aider runs after it (`--auto-test`), then the fix. Aider
applies them and runs the test itself: the file is repaired, and every model call (LiteLLM's OpenAI client) is
stored under `aider` with exact ids, trainable though Aider asks for temperature 0 (the run owns the sampling);
its edits and test runs are read back from its chat history."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agl.client import Client
from agl.common.attributes import TOOL_CALL_ORDINAL, TOOL_CALL_ORDINAL_OF, TOOL_COMMAND, TOOL_NAME
from agl.common.processes import ServerProcess, start_server
from agl.testing.fixtures import wait_rollouts
from agl.testing.upstream import encode, say_line
from tests.harness_support import TEST_COMMAND, assert_stored_exactly, defective_calc

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "coding-agents" / "aider.py"
AIDER = Path(os.environ.get("AGL_AIDER") or REPO / ".venv-aider" / "bin" / "aider")
# Aider's request holds, before the task, two worked examples and its files' message, each answered by an
# assistant message: the scripted model's k-th step answers the conversation holding k-1 of them, so its first
# reply is step 5; each reply Aider reflects (an edit that failed, a test that failed) adds two or three more
FIRST, SECOND, THIRD = 4, 6, 9


def _edit(old: str, new: str) -> str:
    """A reply in Aider's `diff` edit format: one SEARCH/REPLACE block for calc.py."""
    return f"calc.py\n```python\n<<<<<<< SEARCH\n    return {old}\n=======\n    return {new}\n>>>>>>> REPLACE\n```\n"


@pytest.fixture(autouse=True)
def aider_installed() -> None:
    if not AIDER.exists():
        pytest.fail(f"Aider is not installed at {AIDER}: `make harnesses` builds .venv-aider with it")


@pytest.fixture
def owning_server(tmp_path: Path, agl_upstream: str) -> Iterator[ServerProcess]:
    """`agl serve` owning Aider's sampling, as `agl train` does: its `temperature: 0` calls are sampled and stored
    trainable."""
    srv = start_server(tmp_path / "run", upstream=agl_upstream, extra_args=["--own-sampling-for", "aider"])
    yield srv
    srv.stop()


def test_aider_repairs_a_file_with_its_own_edits_and_every_call_is_stored_exactly(
    owning_server: ServerProcess, agl_workers: Any, tmp_path: Path
) -> None:
    files = defective_calc(tmp_path)
    replies = {FIRST: _edit("a * b", "a + b"), SECOND: _edit("a - b", "a * b"), THIRD: _edit("a * b", "a + b")}
    steps = [replies.get(k, f"(unused step {k})") for k in range(THIRD + 1)]
    prompt = "Fix calc.py so that add() adds; check.py is its test.\n" + "".join(say_line(s) for s in steps)
    task = {"files": str(files), "prompt": prompt, "test": TEST_COMMAND, "edit": ["calc.py"]}
    with Client(owning_server.url) as agl_client:
        (rollout,) = agl_client.enqueue(task)
        agl_workers(f"{EXAMPLE}:repair", owning_server.url)
        (done,) = wait_rollouts(agl_client, [rollout.id], timeout=180)
        detail = agl_client.rollout_detail(rollout.id)
    (span,) = [s for s in detail.spans if s.name.startswith("cli:")]
    tail = span.attributes.get("cli.output_tail")
    assert done.status.value == "succeeded", tail
    assert detail.rollout.final_reward == 1.0, tail  # its third edit fixed it
    assert span.status.value == "ok" and span.agent_name == "aider", tail

    calls = sorted(detail.llm_calls, key=lambda c: c.seq)
    assert len(calls) == 3  # one call per reply, nothing else sent (no commit messages, no summaries)
    assert_stored_exactly(calls, "aider", "chat", tests_ran=False)  # Aider sends no tool results
    assert [c.response_ids for c in calls] == [encode(replies[k]) for k in (FIRST, SECOND, THIRD)]
    # the failing test's output went back to the model in Aider's own words
    assert any("AssertionError" in str(m.get("content")) for m in calls[2].request["messages"])  # type: ignore[union-attr]
    assert span.attributes["cli.egress"] == [] and not detail.rollout.bypassed_llm_calls

    # its runs from its chat history, each naming the reply it followed (the k-th of Aider's calls): the edit that
    # did not apply and the test that failed are errors
    runs = [s for s in detail.spans if TOOL_COMMAND in s.attributes]
    said = [(s.attributes[TOOL_CALL_ORDINAL], s.attributes[TOOL_NAME], s.status.value) for s in runs]
    assert said == [(0, "edit", "error"), (1, "edit", "ok"), (1, "test", "error"), (2, "edit", "ok"), (2, "test", "ok")]
    assert all(s.agent_name == "aider" and s.attributes[TOOL_CALL_ORDINAL_OF] == [] for s in runs)
    assert [s.attributes[TOOL_COMMAND] for s in runs if s.attributes[TOOL_NAME] == "test"] == [TEST_COMMAND] * 2
    # and AIR places each after the reply it followed (Aider calls no tools: its order among all of Aider's calls)
    from agl.learn.air import llm_seq_before

    assert [llm_seq_before(s, calls) for s in runs] == [calls[k].seq for k in (0, 1, 1, 2, 2)]
