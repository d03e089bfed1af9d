"""What the coding-harness tests (tests/test_harness_*.py) share: the task every harness repairs, and the checks of
its stored calls."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from agl.common.attributes import TOOL_CALL_ID, TOOL_CALL_ORDINAL, TOOL_COMMAND, TOOL_NAME
from agl.learn.air import air_rewards, llm_seq_before
from agl.schema import LLMCall, RolloutDetail
from agl.testing.upstream import encode, render_prompt

TEST_COMMAND = "python3 -B check.py"  # the task's test: exit 0 once calc.add adds (1 before: an AssertionError)
# -B: no bytecode cache, whose check (the source's mtime in seconds, and its size) misses an edit of the same size
# within the second of the last run: the stale module ran, and a fixed file still failed its test
FIXED_ANSWER = "Fixed: add() returns a + b and check.py passes."


def defective_calc(tmp_path: Path) -> Path:
    """The task's files: calc.py whose add() subtracts, and check.py, its test, which prints `tests pass`."""
    files = tmp_path / "task-files"
    files.mkdir()
    (files / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (files / "check.py").write_text("import calc\n\nassert calc.add(2, 3) == 5, calc.add(2, 3)\nprint('tests pass')\n")
    return files


def assert_stored_exactly(calls: Sequence[LLMCall], agent: str, route: str, *, tests_ran: bool = True) -> None:
    """Every call under the harness's agent, through `route`, trainable, its prompt ids the scripted model's own
    rendering of the request it was sent; and (`tests_ran`) the passing test's output back in the last prompt."""
    for call in calls:
        assert call.agent_name == agent and call.route == route and call.trainable
        assert call.prompt_ids == encode(render_prompt(call.request["messages"], call.request.get("tools")))  # type: ignore[arg-type]
    if tests_ran:
        last_prompt = calls[-1].request["messages"]
        assert any("tests pass" in str(m.get("content")) for m in last_prompt if m.get("role") == "tool")  # type: ignore[union-attr]


def assert_tool_runs(detail: RolloutDetail, expected: Sequence[tuple[int, str, str]]) -> None:
    """The harness's tool runs, read back from its own report (agl.record_tool_runs) as tool spans: exactly
    `expected`, each as (the index among the rollout's calls of the call that asked for it, the tool, how it ended),
    each naming the call it answers (by id or by order: their times cannot, they are recorded after the harness
    ended); and AIR's default rule penalises exactly the failed ones, right after the call that asked."""
    calls = sorted(detail.llm_calls, key=lambda c: c.seq)
    runs = [s for s in detail.spans if TOOL_COMMAND in s.attributes]  # not run_cli's own span
    assert all(TOOL_CALL_ID in s.attributes or TOOL_CALL_ORDINAL in s.attributes for s in runs)
    index = {c.seq: i for i, c in enumerate(calls)}
    placed = sorted(
        (index.get(llm_seq_before(s, calls), -1), str(s.attributes[TOOL_NAME]), s.status.value) for s in runs
    )
    assert placed == sorted(expected)
    penalised = sorted(index.get(r.after_llm_seq, -1) for r in air_rewards(detail) if r.value < 0)
    assert penalised == sorted(i for i, _, status in expected if status == "error")
