"""agl.record_tool_runs' readers of Aider's chat history and Qwen Code's stream-json, on their real output (Aider
0.86.2 and Qwen Code 0.24.4 against the scripted upstream; paths shortened)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agl.capture.tool_runs import read_tool_runs

# Aider's chat history of a run with --auto-test: an edit that did not apply, one that applied and failed the test
# (Aider asks to fix it), then the fix, whose passing test Aider does not mention
AIDER_HISTORY = "\n# aider chat started at 2026-11-29 08:25:59\n\n> aider --model openai/scripted --model-metadata-file /home/meta.json --message-file /home/prompt.txt --yes-always --no-auto-commits --no-git --no-pretty --no-check-update --no-show-model-warnings --analytics-disable --no-show-release-notes --chat-history-file /home/home/chat.md --input-history-file /home/home/input.txt --test-cmd python3 check.py --auto-test --no-suggest-shell-commands --map-tokens 0 --edit-format diff calc.py  \n> Aider v0.86.2  \n> Model: openai/scripted with diff edit format  \n> Git repo: none  \n> Repo-map: disabled  \n> Added calc.py to the chat.  \n\n#### Fix calc.py so that add() adds; check.py is its test.  \n\ncalc.py\n```python\n<<<<<<< SEARCH\n    return a * b\n=======\n    return a + b\n>>>>>>> REPLACE\n```\n\n> Tokens: 2.1k sent, 27 received.  \n> The LLM did not conform to the edit format.  \n> https://aider.chat/docs/troubleshooting/edit-errors.html  \n> # 1 SEARCH/REPLACE block failed to match!\n\n## SearchReplaceNoExactMatch: This SEARCH block failed to exactly match lines in calc.py\n<<<<<<< SEARCH\n    return a * b\n=======\n    return a + b\n>>>>>>> REPLACE\n\nThe SEARCH section must exactly match an existing block of lines including all white space, comments, indentation, docstrings, etc  \n\ncalc.py\n```python\n<<<<<<< SEARCH\n    return a - b\n=======\n    return a * b\n>>>>>>> REPLACE\n```\n\n> Tokens: 2.2k sent, 27 received.  \n> Applied edit to calc.py  \n> Added 5 lines of output to the chat.  \n> Attempt to fix test errors? (Y)es/(N)o [Yes]: y  \n\ncalc.py\n```python\n<<<<<<< SEARCH\n    return a * b\n=======\n    return a + b\n>>>>>>> REPLACE\n```\n\n> Tokens: 2.5k sent, 27 received.  \n> Applied edit to calc.py  \n"


def test_aider_s_edits_and_test_runs_each_after_the_reply_that_led_to_them(tmp_path: Path) -> None:
    history = tmp_path / "chat-history.md"
    history.write_text(AIDER_HISTORY)
    runs = read_tool_runs(history, "aider")
    said = [(r.ordinal, r.tool, r.status, r.command) for r in runs]
    assert said == [
        (0, "edit", "error", "calc.py"),
        (1, "edit", "ok", "calc.py"),
        (1, "test", "error", "python3 check.py"),
        (2, "edit", "ok", "calc.py"),
        (2, "test", "ok", "python3 check.py"),
    ]
    assert all(r.ordinal_of == () and r.call_id is None and r.exit_code is None for r in runs)


def test_aider_without_auto_test_reports_edits_only_and_a_second_session_counts_its_replies_anew(
    tmp_path: Path,
) -> None:
    first = AIDER_HISTORY.replace(" --auto-test", "")
    history = tmp_path / "chat-history.md"
    history.write_text(first + AIDER_HISTORY)  # Aider appends each session to the same file
    runs = read_tool_runs(history, "aider")
    # the first session: no test named on its command line, yet the failure it asked to fix is a failed test run
    assert [(r.ordinal, r.tool, r.status) for r in runs[:4]] == [
        (0, "edit", "error"),
        (1, "edit", "ok"),
        (1, "test", "error"),
        (2, "edit", "ok"),
    ]
    assert [(r.ordinal, r.tool) for r in runs[4:]] == [(0, "edit"), (1, "edit"), (1, "test"), (2, "edit"), (2, "test")]


def _event(kind: str, blocks: list[dict[str, Any]], parent: str | None = None) -> str:
    role = "assistant" if kind == "assistant" else "user"
    return json.dumps({"type": kind, "parent_tool_use_id": parent, "message": {"role": role, "content": blocks}})


def test_qwen_code_s_stream_json_with_its_shell_s_exit_codes_and_its_sub_agent_s_runs_under_the_agent(
    tmp_path: Path,
) -> None:
    failed = (
        "Command: python3 check.py\nDirectory: (root)\nOutput: Traceback (most recent call last):\n"
        "AssertionError: -1\nError: (none)\nExit Code: 1\nSignal: (none)\nProcess Group PGID: (none)"
    )
    passed = failed.replace("Traceback (most recent call last):\nAssertionError: -1", "tests pass")
    passed = passed.replace("Exit Code: 1", "Exit Code: 0")
    killed = passed.replace("Exit Code: 0\nSignal: (none)", "Exit Code: (none)\nSignal: 9")
    shell: dict[str, Any] = {"type": "tool_use", "name": "run_shell_command", "input": {"command": "python3 check.py"}}
    lines = [
        _event("assistant", [shell | {"id": "c1"}]),
        _event("user", [{"type": "tool_result", "tool_use_id": "c1", "is_error": True, "content": failed}]),
        _event("assistant", [{"type": "tool_use", "id": "c2", "name": "agent", "input": {"prompt": "Fix add."}}]),
        _event("assistant", [shell | {"id": "c3"}], parent="c2"),
        _event("user", [{"type": "tool_result", "tool_use_id": "c3", "is_error": False, "content": passed}], "c2"),
        _event("user", [{"type": "tool_result", "tool_use_id": "c2", "is_error": False, "content": "done"}]),
        _event("assistant", [shell | {"id": "c4"}]),
        _event("user", [{"type": "tool_result", "tool_use_id": "c4", "is_error": True, "content": killed}]),
        json.dumps({"type": "result", "subtype": "success", "is_error": False, "result": "Fixed."}),
    ]
    report = tmp_path / "qwen.jsonl"
    report.write_text("\n".join(lines) + "\n")
    runs = read_tool_runs(report, "qwen-code")
    said = [(r.call_id, r.tool, r.status, r.exit_code, r.sub_agent) for r in runs]
    # exit codes from the results' text, not -1; a signal's kill (no code said) falls back to 1 for a failure;
    # the sub-agent's run stays under the agent, where Qwen Code's sub-agent calls are stored
    assert said == [
        ("c1", "run_shell_command", "error", 1, False),
        ("c3", "run_shell_command", "ok", 0, False),
        ("c2", "agent", "ok", None, False),
        ("c4", "run_shell_command", "error", 1, False),
    ]
    # Claude Code's reader keeps its own sub-agent marking on the same events
    assert [r.sub_agent for r in read_tool_runs(report, "claude-code")] == [False, True, False, False]
