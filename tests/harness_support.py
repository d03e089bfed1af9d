"""What the coding-harness tests (tests/test_harness_*.py) share: the task every harness repairs, and the checks of
its stored calls."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from agl.schema import LLMCall
from agl.testing.upstream import encode, render_prompt

TEST_COMMAND = "python3 check.py"  # the task's test: exit 0 once calc.add adds
FIXED_ANSWER = "Fixed: add() returns a + b and check.py passes."


def defective_calc(tmp_path: Path) -> Path:
    """The task's files: calc.py whose add() subtracts, and check.py, its test, which prints `tests pass`."""
    files = tmp_path / "task-files"
    files.mkdir()
    (files / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (files / "check.py").write_text("import calc\n\nassert calc.add(2, 3) == 5, calc.add(2, 3)\nprint('tests pass')\n")
    return files


def assert_stored_exactly(calls: Sequence[LLMCall], agent: str, route: str) -> None:
    """Every call under the harness's agent, through `route`, trainable, its prompt ids the scripted model's own
    rendering of the request it was sent; and the test's output back in the last prompt."""
    for call in calls:
        assert call.agent_name == agent and call.route == route and call.trainable
        assert call.prompt_ids == encode(render_prompt(call.request["messages"], call.request.get("tools")))  # type: ignore[arg-type]
    last_prompt = calls[-1].request["messages"]
    assert any("tests pass" in str(m.get("content")) for m in last_prompt if m.get("role") == "tool")  # type: ignore[union-attr]
