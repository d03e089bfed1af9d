"""A command-line agent's own tool runs, read back from the output it documents: `agl.record_tool_runs(...)`.

A harness run by `agl.run_cli` executes its tools (a shell command, a file edit) in its own process, so agl sees
only the model calls around them. Each harness reports its runs in a machine-readable form; this reads that report
and records every run as a tool span in the rollout, `ok`, `error` (a non-zero exit, an edit that did not apply)
or `unset` (neither: a run the harness did not carry out), so AIR's `ToolStatusRule` rewards it:

    done = agl.run_cli([claude, "-p", prompt, "--output-format", "stream-json", "--verbose"], llm=llm,
                       agent="claude-code", cwd=ws)
    agl.record_tool_runs(done, "claude-code", agent="claude-code")

The formats (`FORMATS`):
- `claude-code`: `claude -p --output-format stream-json --verbose` (a `tool_use` block, then its `tool_result`
  with `is_error`); a sub-agent's runs carry `parent_tool_use_id` and go under `AGENT/subagent`, as its calls do;
- `codex`: `codex exec --json` (items `command_execution` with `exit_code`, `file_change` with `status`);
- `opencode`: `opencode run --format json` (`tool_use` events, their `state.status`, bash's `metadata.exit`);
- `mini-swe-agent`: the trajectory `mini -o FILE` writes (its actions and their `returncode`).

The spans are recorded after the harness ended, so their times cannot say which model call asked for a run. Each
span says it instead: by the tool call's id (`gen_ai.tool.call.id`, the id agl's proxy answered with) where the
harness reports one, else by its order among the agent's calls of the listed tools (Codex reports no id: its k-th
run answers its k-th `exec_command`, `apply_patch` or `shell` call). `agl.learn.air.llm_seq_before` reads both.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from agl.capture.cli_agent import CliResult
from agl.capture.sandbox.files import read_agent_file
from agl.capture.tracing.spans import record_span
from agl.common import attributes as attr
from agl.protocol import SUB_AGENT_LABEL

log = logging.getLogger("agl.worker")
Format = Literal["claude-code", "codex", "opencode", "mini-swe-agent"]
FORMATS: tuple[str, ...] = ("claude-code", "codex", "opencode", "mini-swe-agent")
TAIL_CHARS = 2000
# the model-side tools a Codex run answers with a command or a file change (its k-th run: the k-th such call)
CODEX_TOOLS = ("exec_command", "apply_patch", "shell")

Status = Literal["ok", "error", "unset"]


@dataclass(frozen=True)
class ToolRun:
    """One tool run as the harness reported it."""

    tool: str
    status: Status
    command: str = ""  # what it ran (a shell command, a file's path, the tool's input as JSON)
    exit_code: int | None = None
    output_tail: str = ""
    call_id: str | None = None  # the model's tool call it answers, when the harness says
    ordinal: int | None = None  # else its order among the agent's calls of `CODEX_TOOLS` (0 = the first)
    sub_agent: bool = False  # run by a sub-agent of the harness (its calls are stored as `AGENT/subagent`)
    start: float | None = None  # seconds since the epoch, when the harness says
    end: float | None = None


def record_tool_runs(
    source: CliResult | str | os.PathLike[str], format: str, *, agent: str, parent_id: str | None = None
) -> int:
    """Record the tool runs a harness reported as tool spans of the current rollout, under `agent` (the name its
    calls are stored under). `source`: `run_cli`'s result (its transcript is read) or the report's path. Returns how
    many were recorded: none when the report is missing (a harness killed on its time limit may write none)."""
    runs = read_tool_runs(source, format)
    now = time.time()
    for run in runs:
        attributes: dict[str, Any] = {
            attr.TOOL_NAME: run.tool,
            attr.TOOL_COMMAND: run.command[:TAIL_CHARS],
            attr.TOOL_EXIT_CODE: run.exit_code if run.exit_code is not None else -1,
            attr.TOOL_OUTPUT_TAIL: run.output_tail[-TAIL_CHARS:],
        }
        if run.call_id is not None:
            attributes[attr.TOOL_CALL_ID] = run.call_id
        if run.ordinal is not None:
            attributes[attr.TOOL_CALL_ORDINAL] = run.ordinal
            attributes[attr.TOOL_CALL_ORDINAL_OF] = list(CODEX_TOOLS)
        start = run.start if run.start is not None else now
        record_span(
            run.tool,
            kind="tool",
            start_time=start,
            end_time=run.end if run.end is not None else start,
            status=run.status,
            status_message=_failure(run) if run.status == "error" else None,
            attributes=attributes,
            agent_name=f"{agent}/{SUB_AGENT_LABEL}" if run.sub_agent else agent,
            parent_id=parent_id,
        )
    return len(runs)


def read_tool_runs(source: CliResult | str | os.PathLike[str], format: str) -> list[ToolRun]:
    """The runs in a harness's report, in the order it ran them (see the module's docstring for `format`)."""
    if format not in READERS:
        raise ValueError(f"agl.record_tool_runs: unknown format {format!r}; known: {', '.join(FORMATS)}")
    try:
        if isinstance(source, CliResult):  # agl's own file, outside the agent's reach
            text = source.transcript.read_text(errors="replace")
        else:  # a report the agent wrote (a trajectory in its home): no link followed out of its folders
            text = read_agent_file(Path(source)).decode(errors="replace")
    except OSError:
        return []
    except ValueError as exc:
        log.warning("agl.record_tool_runs: %s", exc)
        return []
    return READERS[format](text)


def _failure(run: ToolRun) -> str:
    said = f"exit {run.exit_code}" if run.exit_code not in (None, 0) else "failed"
    last_line = next((line for line in reversed(run.output_tail.splitlines()) if line.strip()), "")
    return f"{said}: {last_line[:200]}" if last_line else said


def _events(text: str) -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSON-lines report, skipping anything else its transcript holds (stderr lines, a line
    cut short when the harness was killed)."""
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            yield event


def _text(content: Any) -> str:
    """A tool result's content: a string, or a list of blocks whose texts are joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return "" if content is None else str(content)


def _exit_code_said(output: str) -> int | None:
    """Claude Code's Bash says a failed command's code in its result: `Exit code N` (maybe after `Error: `)."""
    head = output.removeprefix("Error: ").strip()
    if head.startswith("Exit code "):
        digits = head.removeprefix("Exit code ").split(maxsplit=1)[0] if head != "Exit code " else ""
        return int(digits) if digits.lstrip("-").isdigit() else None
    return None


def _claude_code(text: str) -> list[ToolRun]:
    asked: dict[str, tuple[str, str, bool]] = {}  # tool_use id → (tool, its input, by a sub-agent)
    runs: list[ToolRun] = []
    for event in _events(text):
        message = event.get("message")
        blocks = message.get("content") if isinstance(message, dict) else None
        if not isinstance(blocks, list):
            continue
        sub_agent = event.get("parent_tool_use_id") is not None
        for block in blocks:
            if not isinstance(block, dict):
                continue
            if event.get("type") == "assistant" and block.get("type") == "tool_use":
                tool_input = block.get("input") or {}
                command = tool_input.get("command") or tool_input.get("file_path") or json.dumps(tool_input)
                asked[str(block.get("id"))] = (str(block.get("name")), str(command), sub_agent)
            elif event.get("type") == "user" and block.get("type") == "tool_result":
                call_id = str(block.get("tool_use_id"))
                if call_id not in asked:
                    continue
                tool, command, by_sub_agent = asked.pop(call_id)
                output = _text(block.get("content"))
                failed = block.get("is_error") is True
                code = _exit_code_said(output) if tool == "Bash" else None
                if tool == "Bash" and code is None:
                    code = 1 if failed else 0
                runs.append(
                    ToolRun(
                        tool=tool,
                        status="error" if failed else "ok",
                        command=command,
                        exit_code=code,
                        output_tail=output[-TAIL_CHARS:],
                        call_id=call_id,
                        sub_agent=by_sub_agent,
                    )
                )
    return runs


def _codex(text: str) -> list[ToolRun]:
    items: dict[str, dict[str, Any]] = {}  # item id → its latest state, in the order items first appeared
    for event in _events(text):
        item = event.get("item")
        if isinstance(item, dict) and item.get("type") in ("command_execution", "file_change"):
            items[str(item.get("id"))] = item
    runs: list[ToolRun] = []
    for ordinal, item in enumerate(items.values()):
        status = str(item.get("status"))
        if item["type"] == "command_execution":
            code = item.get("exit_code")
            done = isinstance(code, int)
            outcome: Status = "unset" if not done else "ok" if code == 0 else "error"
            command, output = str(item.get("command", "")), str(item.get("aggregated_output", ""))
        else:
            outcome = "ok" if status == "completed" else "error" if status == "failed" else "unset"
            code = None
            changes = item.get("changes") or []
            command = " ".join(f"{c.get('kind')} {c.get('path')}" for c in changes if isinstance(c, dict))
            output = ""
        runs.append(
            ToolRun(
                tool=str(item["type"]),
                status=outcome,
                command=command,
                exit_code=code if isinstance(code, int) else None,
                output_tail=output[-TAIL_CHARS:],
                ordinal=ordinal,
            )
        )
    return runs


def _opencode(text: str) -> list[ToolRun]:
    runs: list[ToolRun] = []
    for event in _events(text):
        part = event.get("part")
        if event.get("type") != "tool_use" or not isinstance(part, dict):
            continue
        state = part.get("state") or {}
        status = state.get("status")
        metadata = state.get("metadata") or {}
        code = metadata.get("exit")
        times = state.get("time") or {}
        if status == "error":
            outcome: Status = "error"
        elif status == "completed":
            outcome = "error" if isinstance(code, int) and code != 0 else "ok"
        else:
            outcome = "unset"
        tool_input = state.get("input") or {}
        command = tool_input.get("command") or tool_input.get("filePath") or json.dumps(tool_input)
        output = str(state.get("output") if status == "completed" else state.get("error") or "")
        runs.append(
            ToolRun(
                tool=str(part.get("tool")),
                status=outcome,
                command=str(command),
                exit_code=code if isinstance(code, int) else None,
                output_tail=output[-TAIL_CHARS:],
                call_id=str(part["callID"]) if part.get("callID") else None,
                start=times["start"] / 1000 if isinstance(times.get("start"), int | float) else None,
                end=times["end"] / 1000 if isinstance(times.get("end"), int | float) else None,
            )
        )
    return runs


def _mini_swe_agent(text: str) -> list[ToolRun]:
    try:
        trajectory = json.loads(text)
    except ValueError:
        return []
    messages = trajectory.get("messages") if isinstance(trajectory, dict) else None
    asked: dict[str, tuple[str, float | None]] = {}  # tool call id → (its command, when the answer asking came)
    runs: list[ToolRun] = []
    for message in messages if isinstance(messages, list) else []:
        extra = message.get("extra") or {}
        stamp = extra.get("timestamp")
        when = float(stamp) if isinstance(stamp, int | float) else None
        if message.get("role") == "assistant":
            for action in extra.get("actions") or []:
                asked[str(action.get("tool_call_id"))] = (str(action.get("command", "")), when)
        elif message.get("role") == "tool" and str(message.get("tool_call_id")) in asked:
            call_id = str(message.get("tool_call_id"))
            command, start = asked.pop(call_id)
            code = extra.get("returncode")
            # mini reports the command that ends the run (its submission) as not executed: neither ok nor failed
            ended_run = extra.get("exception_info") == "action was not executed"
            outcome: Status = "unset" if ended_run else "ok" if code == 0 else "error"
            runs.append(
                ToolRun(
                    tool="bash",
                    status=outcome,
                    command=command,
                    exit_code=code if isinstance(code, int) else None,
                    output_tail=str(extra.get("raw_output", ""))[-TAIL_CHARS:],
                    call_id=call_id,
                    start=start,
                    end=when if when is not None else start,
                )
            )
    return runs


READERS = {"claude-code": _claude_code, "codex": _codex, "opencode": _opencode, "mini-swe-agent": _mini_swe_agent}
