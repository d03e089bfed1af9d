"""Reading a harness's report never raises on what the report holds (agl.capture.tool_runs): a line nested past any
parser's depth, events of shapes no harness writes, a line longer than the limit; each is skipped and logged, and
the runs around it are read. A transcript is streamed: a million runs are read in bounded memory."""

from __future__ import annotations

import json
import logging
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from agl.capture import tool_runs
from agl.capture.cli_agent import CliResult
from agl.capture.tool_runs import iter_tool_runs, read_tool_runs


def cli_result(transcript: Path) -> CliResult:
    return CliResult(returncode=0, timed_out=False, seconds=1.0, output_tail="", transcript=transcript)


def bash_pair(i: int) -> list[dict[str, Any]]:
    use = {"type": "tool_use", "id": f"t{i}", "name": "Bash", "input": {"command": f"echo {i}"}}
    result = {"type": "tool_result", "tool_use_id": f"t{i}", "content": f"{i}\n", "is_error": False}
    return [
        {"type": "assistant", "message": {"content": [use]}},
        {"type": "user", "message": {"content": [result]}},
    ]


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_a_deeply_nested_line_is_skipped_and_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    deep = '{"type": "assistant", "message": ' + '{"a": ' * 200_000 + "1" + "}" * 200_000 + "}"
    deep_list = '{"type": "user", "message": {"content": ' + "[" * 200_000 + "]" * 200_000 + "}}"
    lines = [json.dumps(e) for e in bash_pair(0)] + [deep, deep_list] + [json.dumps(e) for e in bash_pair(1)]
    with caplog.at_level(logging.WARNING, logger="agl.worker"):
        runs = read_tool_runs(cli_result(write(tmp_path / "t.txt", lines)), "claude-code")
    assert [r.command for r in runs] == ["echo 0", "echo 1"]
    assert "2 lines not JSON" in caplog.text


ODD_CLAUDE = [
    {"type": "assistant", "message": ["not", "an", "object"]},
    {"type": "assistant", "message": {"content": {"a": "dict"}}},
    {"type": "assistant", "message": {"content": [{"type": "tool_use", "id": ["x"], "name": None, "input": [1, 2]}]}},
    {"type": "assistant", "message": {"content": [{"type": "tool_use", "id": "y", "name": 7, "input": "ls"}]}},
    {"type": "user", "message": {"content": [{"type": "tool_result", "tool_use_id": "y", "content": {"deep": [1]}}]}},
    {"type": "user", "message": {"content": [{"type": "tool_result", "tool_use_id": ["x"], "content": 12}]}},
    {"type": "user", "message": {"content": [{"type": "tool_result", "tool_use_id": "t", "content": [1, "a", None]}]}},
    {"type": "user", "message": {"content": "text"}},
    {"type": "assistant", "message": {"content": [{"type": "tool_use", "id": "z", "input": None}]}},
    {"type": "user", "message": {"content": [{"type": "tool_result", "tool_use_id": "z", "content": [{"text": 5}]}]}},
]
ODD_CODEX = [
    {"type": "item.completed", "item": ["a"]},
    {"type": "item.completed", "item": {"type": "command_execution"}},
    {"type": "item.completed", "item": {"id": 5, "type": "command_execution", "exit_code": "0", "command": [1]}},
    {"type": "item.completed", "item": {"id": "f", "type": "file_change", "changes": "all"}},
    {"type": "item.completed", "item": {"id": "g", "type": "file_change", "changes": [1, {"path": ["p"]}]}},
    {"type": "item.completed", "item": {"id": "h", "type": "command_execution", "exit_code": True}},
    {"type": "item.started", "item": {"id": "i", "type": "command_execution", "aggregated_output": {"a": 1}}},
    {"type": "item.completed", "item": {"id": "j", "type": "command_execution", "exit_code": 2.5}},
    {"type": "item.completed", "item": {"id": {"x": 1}, "type": "file_change", "status": ["completed"]}},
    {"type": "item.completed", "item": None},
]
ODD_OPENCODE = [
    {"type": "tool_use", "part": ["a"]},
    {"type": "tool_use", "part": {"state": "done"}},
    {"type": "tool_use", "part": {"tool": "bash", "state": {"metadata": "x", "time": [1, 2]}}},
    {"type": "tool_use", "part": {"tool": None, "state": {"status": "completed", "input": [1], "output": {"a": 1}}}},
    {"type": "tool_use", "part": {"tool": "bash", "state": {"status": "error", "error": 5, "input": "ls"}}},
    {"type": "tool_use", "part": {"tool": "bash", "callID": 7, "state": {"time": {"start": "now", "end": True}}}},
    {"type": "tool_use", "part": {"tool": "edit", "state": {"input": {"command": ["a"]}, "metadata": {"exit": "1"}}}},
    {"type": "tool_use", "part": {"tool": ["x"], "state": None}},
    {"type": "tool_use", "part": {"tool": "bash", "state": {"status": "completed", "metadata": {"exit": 3}}}},
    {"type": "tool_use"},
]


@pytest.mark.parametrize(
    ("format", "odd", "good"),
    [
        ("claude-code", ODD_CLAUDE, [e for i in range(2) for e in bash_pair(i)]),
        (
            "codex",
            ODD_CODEX,
            [{"type": "item.completed", "item": {"id": "ok", "type": "command_execution", "exit_code": 0}}],
        ),
        ("opencode", ODD_OPENCODE, [{"type": "tool_use", "part": {"tool": "bash", "state": {"status": "completed"}}}]),
    ],
)
def test_events_of_unexpected_shapes_never_raise(
    tmp_path: Path, format: str, odd: list[dict[str, Any]], good: list[dict[str, Any]]
) -> None:
    lines = [json.dumps(e) for e in [*good[:1], *odd, *good[1:]]]
    runs = read_tool_runs(cli_result(write(tmp_path / "t.txt", lines)), format)
    assert all(r.tool for r in runs)
    good_runs = read_tool_runs(cli_result(write(tmp_path / "g.txt", [json.dumps(e) for e in good])), format)
    assert len(runs) >= len(good_runs) > 0


def test_unexpected_trajectories_of_mini_swe_agent_never_raise(tmp_path: Path) -> None:
    odd: list[Any] = [
        [1, 2],
        {"messages": "none"},
        {"messages": [1, "a", None, {"role": "assistant", "extra": [1]}, {"role": "tool", "extra": {"returncode": 0}}]},
        {
            "messages": [
                {"role": "assistant", "extra": {"actions": "ls"}},
                {"role": "assistant", "extra": {"actions": [1]}},
            ]
        },
        {"messages": [{"role": "assistant", "extra": {"actions": [{"tool_call_id": ["a"], "command": {"x": 1}}]}}]},
    ]
    for i, trajectory in enumerate(odd):
        path = tmp_path / f"t{i}.json"
        path.write_text(json.dumps(trajectory))
        read_tool_runs(path, "mini-swe-agent")
    (tmp_path / "deep.json").write_text('{"messages": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert read_tool_runs(tmp_path / "deep.json", "mini-swe-agent") == []


def test_a_line_over_the_limit_is_skipped_unheld(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(tool_runs, "MAX_LINE_BYTES", 1000)
    big = bash_pair(1)
    big[1]["message"]["content"][0]["content"] = "x" * 5000
    lines = [json.dumps(e) for e in [*bash_pair(0), *big, *bash_pair(2)]]
    with caplog.at_level(logging.WARNING, logger="agl.worker"):
        runs = read_tool_runs(cli_result(write(tmp_path / "t.txt", lines)), "claude-code")
    assert [r.command for r in runs] == ["echo 0", "echo 2"]  # echo 1's result was the long line
    assert "1 lines over 1000 bytes" in caplog.text


def test_a_million_runs_stream_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    with path.open("w") as f:
        for i in range(1_000_000):
            state = {"status": "completed", "input": {"command": f"echo {i}"}, "output": str(i)}
            f.write(
                json.dumps({"type": "tool_use", "part": {"tool": "bash", "callID": f"c{i}", "state": state}}) + "\n"
            )
    tracemalloc.start()
    count = sum(1 for _ in iter_tool_runs(cli_result(path), "opencode"))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert count == 1_000_000
    assert peak < 20 * 2**20, peak  # the transcript is ~130 MB
