"""A harness's own report of its tool runs, read back (agl.capture.tool_runs): each format as its harness documents
it, with what a transcript also holds (stderr lines, a line cut short by a kill). The harnesses' real reports are
read in tests/test_harness_*.py, through real runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agl.capture.tool_runs import CODEX_TOOLS, read_tool_runs


def jsonl(path: Path, events: list[dict[str, Any]], noise: str = "") -> Path:
    path.write_text(noise + "".join(json.dumps(e) + "\n" for e in events) + '{"type": "assist')  # cut short
    return path


def test_claude_code_runs_and_a_sub_agent_s_runs(tmp_path: Path) -> None:
    def use(call_id: str, name: str, tool_input: dict[str, Any], parent: str | None = None) -> dict[str, Any]:
        content = [{"type": "tool_use", "id": call_id, "name": name, "input": tool_input}]
        return {"type": "assistant", "message": {"content": content}, "parent_tool_use_id": parent}

    def result(call_id: str, content: Any, is_error: bool = False, parent: str | None = None) -> dict[str, Any]:
        block = {"type": "tool_result", "tool_use_id": call_id, "content": content, "is_error": is_error}
        return {"type": "user", "message": {"content": [block]}, "parent_tool_use_id": parent}

    events = [
        {"type": "system", "subtype": "init", "tools": ["Read", "Bash"]},
        use("t1", "Bash", {"command": "python3 check.py"}),
        result("t1", "Exit code 1\nTraceback ...\nAssertionError: -1", is_error=True),
        use("t2", "Agent", {"prompt": "fix it"}),
        use("s1", "Edit", {"file_path": "calc.py", "old_string": "-", "new_string": "+"}, parent="t2"),
        result("s1", [{"type": "text", "text": "The file calc.py has been updated."}], parent="t2"),
        result("t2", [{"type": "text", "text": "done"}]),
        use("t3", "Bash", {"command": "python3 check.py"}),
        result("t3", "tests pass"),
        use("t4", "Read", {"file_path": "nope.py"}),  # asked, never answered (the run was killed): not a run
        {"type": "result", "subtype": "success"},
    ]
    report = jsonl(tmp_path / "t.txt", events, noise="[warn] a line on stderr\n")
    runs = read_tool_runs(report, "claude-code")
    assert [(r.tool, r.status, r.exit_code, r.call_id, r.sub_agent) for r in runs] == [
        ("Bash", "error", 1, "t1", False),
        ("Edit", "ok", None, "s1", True),
        ("Agent", "ok", None, "t2", False),
        ("Bash", "ok", 0, "t3", False),
    ]
    assert runs[0].command == "python3 check.py" and "AssertionError" in runs[0].output_tail
    assert runs[1].command == "calc.py" and runs[1].output_tail == "The file calc.py has been updated."


def test_codex_runs_by_order_commands_and_file_changes_counted_together(tmp_path: Path) -> None:
    def item(event: str, **fields: Any) -> dict[str, Any]:
        return {"type": event, "item": fields}

    events = [
        {"type": "thread.started", "thread_id": "th"},
        item("item.started", id="item_0", type="command_execution", command="cat calc.py", exit_code=None),
        item(
            "item.completed",
            id="item_0",
            type="command_execution",
            command="cat calc.py",
            exit_code=0,
            aggregated_output="def add(a, b):\n",
            status="completed",
        ),
        item("item.completed", id="item_1", type="reasoning", text="..."),
        item(
            "item.completed",
            id="item_2",
            type="file_change",
            status="failed",
            changes=[{"path": "calc.py", "kind": "update"}],
        ),
        item(
            "item.completed",
            id="item_3",
            type="command_execution",
            command="python3 check.py",
            exit_code=1,
            aggregated_output="AssertionError",
            status="failed",
        ),
        item("item.completed", id="item_4", type="agent_message", text="Fixed."),
        item("item.started", id="item_5", type="command_execution", command="sleep 99", exit_code=None),  # killed
    ]
    runs = read_tool_runs(jsonl(tmp_path / "t.txt", events), "codex")
    assert [(r.tool, r.status, r.exit_code, r.ordinal) for r in runs] == [
        ("command_execution", "ok", 0, 0),
        ("file_change", "error", None, 1),
        ("command_execution", "error", 1, 2),
        ("command_execution", "unset", None, 3),
    ]
    assert runs[1].command == "update calc.py" and all(r.call_id is None for r in runs)
    assert CODEX_TOOLS == ("exec_command", "apply_patch", "shell")


def test_opencode_runs_with_bash_s_exit_code_and_their_times(tmp_path: Path) -> None:
    def tool_use(call_id: str, tool: str, state: dict[str, Any]) -> dict[str, Any]:
        return {"type": "tool_use", "part": {"id": "prt", "callID": call_id, "tool": tool, "state": state}}

    times = {"start": 1_700_000_000_000, "end": 1_700_000_000_500}
    events = [
        {"type": "step_start", "part": {}},
        tool_use(
            "c1", "read", {"status": "completed", "input": {"filePath": "/w/calc.py"}, "output": "a - b", "time": times}
        ),
        tool_use(
            "c2",
            "bash",
            {
                "status": "completed",
                "input": {"command": "python3 check.py"},
                "output": "AssertionError",
                "metadata": {"exit": 1},
                "time": times,
            },
        ),
        tool_use("c3", "edit", {"status": "error", "input": {"filePath": "/w/calc.py"}, "error": "no match"}),
        {"type": "text", "part": {"text": "done"}},
    ]
    runs = read_tool_runs(jsonl(tmp_path / "t.txt", events), "opencode")
    assert [(r.tool, r.status, r.exit_code, r.call_id) for r in runs] == [
        ("read", "ok", None, "c1"),
        ("bash", "error", 1, "c2"),
        ("edit", "error", None, "c3"),
    ]
    assert (runs[1].start, runs[1].end) == (1_700_000_000.0, 1_700_000_000.5)
    assert runs[2].output_tail == "no match" and runs[2].start is None


def test_mini_swe_agent_s_trajectory_its_submission_neither_ok_nor_failed(tmp_path: Path) -> None:
    def asked(call_id: str, command: str, when: float) -> dict[str, Any]:
        actions = [{"command": command, "tool_call_id": call_id}]
        return {"role": "assistant", "content": "", "extra": {"actions": actions, "timestamp": when}}

    def answered(call_id: str, code: int | None, output: str, when: float, **more: Any) -> dict[str, Any]:
        extra = {"returncode": code, "raw_output": output, "timestamp": when, **more}
        return {"role": "tool", "tool_call_id": call_id, "content": output, "extra": extra}

    messages = [
        {"role": "system", "content": "..."},
        asked("a", "python3 check.py", 10.0),
        answered("a", 1, "AssertionError", 10.5),
        asked("b", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT", 11.0),
        answered("b", None, "", 11.2, exception_info="action was not executed"),
    ]
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"messages": messages}))
    runs = read_tool_runs(path, "mini-swe-agent")
    assert [(r.tool, r.status, r.exit_code, r.call_id, r.start, r.end) for r in runs] == [
        ("bash", "error", 1, "a", 10.0, 10.5),
        ("bash", "unset", None, "b", 11.0, 11.2),
    ]
    path.write_text('{"messages": [')  # cut short: nothing read, nothing raised
    assert read_tool_runs(path, "mini-swe-agent") == []


def test_an_unknown_format_is_named_and_a_missing_report_gives_no_runs(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError,
        match=r"unknown format 'goose'; known: claude-code, codex, opencode, mini-swe-agent, qwen-code, aider",
    ):
        read_tool_runs(tmp_path / "t.txt", "goose")
    assert read_tool_runs(tmp_path / "never-written.txt", "codex") == []
