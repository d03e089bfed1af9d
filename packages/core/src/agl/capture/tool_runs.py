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
- `mini-swe-agent`: the trajectory `mini -o FILE` writes (its actions and their `returncode`);
- `qwen-code`: `qwen --output-format stream-json`, Claude Code's event shape (read as `claude-code` reads it), its
  shell's exit code read from its result text (`Exit Code: N`); a sub-agent's runs stay under AGENT, where its calls
  are (Qwen Code marks a sub-agent's requests in no header, so agl cannot store them apart);
- `aider`: Aider's chat history (`--chat-history-file`, Markdown): its edits (`Applied edit to PATH`, or a reply
  that did not conform to its edit format), the lint and test runs it did after them (`--auto-lint`, `--auto-test`
  named in its command line): a failed one is the one it asks to fix; Aider writes no exit codes.

The spans are recorded after the harness ended, so their times cannot say which model call asked for a run. Each
span says it instead: by the tool call's id (`gen_ai.tool.call.id`, the id agl's proxy answered with) where the
harness reports one, else by its order among the agent's calls of the listed tools (Codex reports no id: its k-th
run answers its k-th `exec_command`, `apply_patch` or `shell` call). Aider calls no tools: its runs carry the
order of the reply they followed among its calls, with an empty list of tools. `agl.learn.air.llm_seq_before` reads both.

A report is read as it streams, line by line (a million runs read whole took 1 GB): a line over MAX_LINE_BYTES, or
one that is not JSON or nests deeper than orjson parses (1,024 levels), is skipped, and so is an event of a shape
its format does not have; nothing in a report makes reading it raise. What was skipped is logged, with counts.
"""

from __future__ import annotations

import io
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

import orjson

from agl.capture.cli_agent import CliResult
from agl.capture.sandbox.files import read_agent_file
from agl.capture.tracing.spans import record_span
from agl.common import attributes as attr
from agl.protocol import SUB_AGENT_LABEL

log = logging.getLogger("agl.worker")
Format = Literal["claude-code", "codex", "opencode", "mini-swe-agent", "qwen-code", "aider"]
FORMATS: tuple[str, ...] = ("claude-code", "codex", "opencode", "mini-swe-agent", "qwen-code", "aider")
TAIL_CHARS = 2000
# the model-side tools a Codex run answers with a command or a file change (its k-th run: the k-th such call)
CODEX_TOOLS = ("exec_command", "apply_patch", "shell")

Status = Literal["ok", "error", "unset"]

# a report's line longer than this is skipped without being held whole: an event carries a tool's output, of which
# only TAIL_CHARS are kept, and Claude Code's largest (a file read whole) stays far under it
MAX_LINE_BYTES = 8 * 2**20
# a report read as one JSON document (mini-swe-agent's trajectory): larger ones are not read
MAX_DOCUMENT_BYTES = 64 * 2**20


@dataclass(frozen=True)
class ToolRun:
    """One tool run as the harness reported it."""

    tool: str
    status: Status
    command: str = ""  # what it ran (a shell command, a file's path, the tool's input as JSON)
    exit_code: int | None = None
    output_tail: str = ""
    call_id: str | None = None  # the model's tool call it answers, when the harness says
    ordinal: int | None = None  # else its order among the agent's calls of `ordinal_of` (0 = the first)
    ordinal_of: tuple[str, ...] = CODEX_TOOLS  # empty: among all the agent's calls (Aider's, which call no tools)
    sub_agent: bool = False  # run by a sub-agent of the harness (its calls are stored as `AGENT/subagent`)
    start: float | None = None  # seconds since the epoch, when the harness says
    end: float | None = None


def record_tool_runs(
    source: CliResult | str | os.PathLike[str], format: str, *, agent: str, parent_id: str | None = None
) -> int:
    """Record the tool runs a harness reported as tool spans of the current rollout, under `agent` (the name its
    calls are stored under). `source`: `run_cli`'s result (its transcript is read) or the report's path. Returns how
    many were recorded: none when the report is missing (a harness killed on its time limit may write none). What
    the report held that could not be read (lines too long or too deep, events of another shape) is skipped and
    logged: a run it could read is recorded all the same."""
    now = time.time()
    recorded = 0
    for run in iter_tool_runs(source, format):
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
            attributes[attr.TOOL_CALL_ORDINAL_OF] = list(run.ordinal_of)
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
        recorded += 1
    return recorded


def read_tool_runs(source: CliResult | str | os.PathLike[str], format: str) -> list[ToolRun]:
    """The runs in a harness's report, in the order it ran them (see the module's docstring for `format`)."""
    return list(iter_tool_runs(source, format))


def iter_tool_runs(source: CliResult | str | os.PathLike[str], format: str) -> Iterator[ToolRun]:
    """The runs in a harness's report as it is read (`read_tool_runs`, one at a time); what could not be read is
    skipped and logged once the report is read."""
    if format not in READERS:
        raise ValueError(f"agl.record_tool_runs: unknown format {format!r}; known: {', '.join(FORMATS)}")
    skipped = Skipped()
    try:
        if isinstance(source, CliResult):  # agl's own file, outside the agent's reach: streamed
            stream: IO[bytes] = open(source.transcript, "rb")  # noqa: SIM115 (closed below)
        else:  # a report the agent wrote (a trajectory in its home): no link followed out of its folders; capped
            stream = io.BytesIO(read_agent_file(Path(source), max_bytes=MAX_DOCUMENT_BYTES + 1))
    except OSError:
        return
    except ValueError as exc:
        log.warning("agl.record_tool_runs: %s", exc)
        return
    with stream:
        yield from READERS[format](stream, skipped)
    skipped.log(format)


class Skipped(Counter[str]):
    """What a report held that could not be read, by why."""

    def log(self, format: str) -> None:
        if self:
            said = ", ".join(f"{n} {why}" for why, n in self.items())
            log.warning(
                "agl.record_tool_runs: skipped what the %s report held that could not be read: %s", format, said
            )


def _failure(run: ToolRun) -> str:
    said = f"exit {run.exit_code}" if run.exit_code not in (None, 0) else "failed"
    last_line = next((line for line in reversed(run.output_tail.splitlines()) if line.strip()), "")
    return f"{said}: {last_line[:200]}" if last_line else said


def _lines(stream: IO[bytes], skipped: Skipped) -> Iterator[bytes]:
    """The lines of `stream`, each at most MAX_LINE_BYTES: a longer one is skipped, read past in pieces of that
    size, never held whole."""
    while line := stream.readline(MAX_LINE_BYTES + 1):
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            skipped[f"lines over {MAX_LINE_BYTES} bytes"] += 1
            while line and not line.endswith(b"\n"):
                line = stream.readline(MAX_LINE_BYTES)
            continue
        yield line


def _loads(text: bytes) -> Any:
    """orjson's parse (it refuses more than 1,024 levels of nesting, without recursing in Python), on the bytes as
    they are, else decoded with replacement characters (a harness's output may hold invalid UTF-8)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return orjson.loads(text.decode(errors="replace"))


def _events(stream: IO[bytes], skipped: Skipped) -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSON-lines report, skipping anything else its transcript holds (stderr lines, a line
    cut short when the harness was killed, a line too long or too deep)."""
    for line in _lines(stream, skipped):
        line = line.strip()
        if not line.startswith(b"{"):
            continue
        try:
            event = _loads(line)
        except orjson.JSONDecodeError:
            skipped["lines not JSON (cut short, or nested over 1,024 levels)"] += 1
            continue
        if isinstance(event, dict):
            yield event


def _each(
    items: Iterable[Any], read: Any, skipped: Skipped, what: str = "events of an unexpected shape"
) -> Iterator[ToolRun]:
    """The runs `read(item)` makes of each item (a list), skipping an item it cannot read: a report's shape is the
    harness's, not agl's, and one odd event must cost that event, not the report."""
    for item in items:
        try:
            runs: list[ToolRun] = read(item)
        except Exception:  # any shape: AttributeError, TypeError, RecursionError...
            skipped[what] += 1
            continue
        yield from runs


def _dumps(value: Any) -> str:
    """`value` as JSON text, or a mark that it could not be written (nested deeper than the interpreter recurses)."""
    try:
        return json.dumps(value)
    except (RecursionError, TypeError, ValueError):
        return "(unreadable)"


def _str(value: Any) -> str:
    return value if isinstance(value, str) else "" if value is None else _dumps(value)


def _name(value: Any) -> str:
    """A tool's name, as the report gives it (never empty: a span needs a name)."""
    return _str(value) or "unknown"


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(content: Any) -> str:
    """A tool result's content: a string, or a list of blocks whose texts are joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_str(b.get("text", "")) for b in content if isinstance(b, dict))
    return _str(content)


def _exit_code_said(output: str) -> int | None:
    """Claude Code's Bash says a failed command's code in its result: `Exit code N` (maybe after `Error: `)."""
    head = output.removeprefix("Error: ").strip()
    if head.startswith("Exit code "):
        digits = head.removeprefix("Exit code ").split(maxsplit=1)[0] if head != "Exit code " else ""
        return _int(digits)
    return None


def _qwen_exit_code(output: str) -> int | None:
    """Qwen Code's run_shell_command ends its result with lines `Exit Code: N` (`(none)` when killed by a signal)."""
    for line in reversed(output.splitlines()):
        if line.startswith("Exit Code: "):
            return _int(line.removeprefix("Exit Code: ").strip())
    return None


def _int(digits: str) -> int | None:
    return int(digits) if digits.lstrip("-").isdigit() and len(digits) < 20 else None


def _code(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _claude_code(stream: IO[bytes], skipped: Skipped, qwen: bool = False) -> Iterator[ToolRun]:
    """Claude Code's stream-json, or Qwen Code's (`qwen`: the same events; its shell tool, its exit codes)."""
    asked: dict[str, tuple[str, str, bool]] = {}  # tool_use id → (tool, its input, by a sub-agent)
    shell = "run_shell_command" if qwen else "Bash"

    def read(event: dict[str, Any]) -> list[ToolRun]:
        message = event.get("message")
        blocks = message.get("content") if isinstance(message, dict) else None
        if not isinstance(blocks, list):
            return []
        # Qwen Code's sub-agent calls are stored under the agent's own name: its runs go there too
        sub_agent = event.get("parent_tool_use_id") is not None and not qwen
        runs: list[ToolRun] = []
        for block in blocks:
            if not isinstance(block, dict):
                continue
            if event.get("type") == "assistant" and block.get("type") == "tool_use":
                tool_input = block.get("input") or {}
                if isinstance(tool_input, dict):
                    command = tool_input.get("command") or tool_input.get("file_path") or tool_input
                else:
                    command = tool_input
                asked[_str(block.get("id"))] = (_name(block.get("name")), _str(command), sub_agent)
            elif event.get("type") == "user" and block.get("type") == "tool_result":
                call_id = _str(block.get("tool_use_id"))
                if call_id not in asked:
                    continue
                tool, command, by_sub_agent = asked.pop(call_id)
                output = _text(block.get("content"))
                failed = block.get("is_error") is True
                code = None if tool != shell else _qwen_exit_code(output) if qwen else _exit_code_said(output)
                if tool == shell and code is None:
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

    yield from _each(_events(stream, skipped), read, skipped)


def _codex(stream: IO[bytes], skipped: Skipped) -> Iterator[ToolRun]:
    """Runs in the order their items first appeared (their ordinal), each once its item completed (or, never
    completed, at the end); only the items not yet completed, and completed ones waiting for an earlier ordinal,
    are held."""
    ordinals: dict[str, int] = {}  # item id → its order among the runs
    latest: dict[int, dict[str, Any]] = {}  # ordinal → its item's latest state, until it completed
    ready: dict[int, ToolRun] = {}
    emitted = 0

    def read(event: dict[str, Any]) -> list[ToolRun]:
        nonlocal emitted
        item = event.get("item")
        if not isinstance(item, dict) or item.get("type") not in ("command_execution", "file_change"):
            return []
        key = _str(item.get("id"))
        ordinal = ordinals.setdefault(key, len(ordinals))
        if ordinal < emitted or ordinal in ready:
            return []  # a state after its completion: its run is taken already
        latest[ordinal] = item
        if event.get("type") != "item.completed":
            return []
        ready[ordinal] = _codex_run(latest.pop(ordinal), ordinal)
        runs = []
        while emitted in ready:
            runs.append(ready.pop(emitted))
            emitted += 1
        return runs

    yield from _each(_events(stream, skipped), read, skipped)
    for ordinal in sorted({*latest, *ready}):  # the items never completed (the harness was killed), in order
        run = ready.pop(ordinal, None)
        if run is None:
            try:
                run = _codex_run(latest[ordinal], ordinal)
            except Exception:  # as in _each
                skipped["events of an unexpected shape"] += 1
                continue
        yield run


def _codex_run(item: dict[str, Any], ordinal: int) -> ToolRun:
    status = _str(item.get("status"))
    if item["type"] == "command_execution":
        code = _code(item.get("exit_code"))
        outcome: Status = "unset" if code is None else "ok" if code == 0 else "error"
        command, output = _str(item.get("command", "")), _str(item.get("aggregated_output", ""))
    else:
        outcome = "ok" if status == "completed" else "error" if status == "failed" else "unset"
        code = None
        changes = item.get("changes") or []
        changes = changes if isinstance(changes, list) else []
        command = " ".join(f"{_str(c.get('kind'))} {_str(c.get('path'))}" for c in changes if isinstance(c, dict))
        output = ""
    return ToolRun(
        tool=str(item["type"]),
        status=outcome,
        command=command,
        exit_code=code,
        output_tail=output[-TAIL_CHARS:],
        ordinal=ordinal,
    )


def _seconds(ms: Any) -> float | None:
    return ms / 1000 if isinstance(ms, int | float) and not isinstance(ms, bool) else None


def _opencode(stream: IO[bytes], skipped: Skipped) -> Iterator[ToolRun]:
    def read(event: dict[str, Any]) -> list[ToolRun]:
        part = event.get("part")
        if event.get("type") != "tool_use" or not isinstance(part, dict):
            return []
        state = _dict(part.get("state"))
        status = state.get("status")
        code = _code(_dict(state.get("metadata")).get("exit"))
        times = _dict(state.get("time"))
        if status == "error":
            outcome: Status = "error"
        elif status == "completed":
            outcome = "error" if code is not None and code != 0 else "ok"
        else:
            outcome = "unset"
        tool_input = state.get("input") or {}
        command = (tool_input.get("command") or tool_input.get("filePath")) if isinstance(tool_input, dict) else None
        output = _str(state.get("output") if status == "completed" else state.get("error") or "")
        return [
            ToolRun(
                tool=_name(part.get("tool")),
                status=outcome,
                command=_str(command or tool_input),
                exit_code=code,
                output_tail=output[-TAIL_CHARS:],
                call_id=_str(part["callID"]) if part.get("callID") else None,
                start=_seconds(times.get("start")),
                end=_seconds(times.get("end")),
            )
        ]

    yield from _each(_events(stream, skipped), read, skipped)


def _mini_swe_agent(stream: IO[bytes], skipped: Skipped) -> Iterator[ToolRun]:
    document = stream.read(MAX_DOCUMENT_BYTES + 1)
    if len(document) > MAX_DOCUMENT_BYTES:
        skipped[f"trajectories over {MAX_DOCUMENT_BYTES} bytes"] += 1
        return
    try:
        trajectory = _loads(document)
    except orjson.JSONDecodeError:
        return  # not written yet, or cut short: no runs
    messages = trajectory.get("messages") if isinstance(trajectory, dict) else None
    asked: dict[str, tuple[str, float | None]] = {}  # tool call id → (its command, when the answer asking came)

    def read(message: Any) -> list[ToolRun]:
        extra = _dict(message.get("extra"))
        stamp = extra.get("timestamp")
        when = float(stamp) if isinstance(stamp, int | float) and not isinstance(stamp, bool) else None
        if message.get("role") == "assistant":
            actions = extra.get("actions") or []
            for action in actions if isinstance(actions, list) else []:
                if isinstance(action, dict):
                    asked[_str(action.get("tool_call_id"))] = (_str(action.get("command", "")), when)
            return []
        call_id = _str(message.get("tool_call_id"))
        if message.get("role") != "tool" or call_id not in asked:
            return []
        command, start = asked.pop(call_id)
        code = _code(extra.get("returncode"))
        # mini reports the command that ends the run (its submission) as not executed: neither ok nor failed
        ended_run = extra.get("exception_info") == "action was not executed"
        outcome: Status = "unset" if ended_run else "ok" if code == 0 else "error"
        return [
            ToolRun(
                tool="bash",
                status=outcome,
                command=command,
                exit_code=code,
                output_tail=_str(extra.get("raw_output", ""))[-TAIL_CHARS:],
                call_id=call_id,
                start=start,
                end=when if when is not None else start,
            )
        ]

    yield from _each(messages if isinstance(messages, list) else [], read, skipped, "messages of an unexpected shape")


def _qwen_code(stream: IO[bytes], skipped: Skipped) -> Iterator[ToolRun]:
    yield from _claude_code(stream, skipped, qwen=True)


def _aider(stream: IO[bytes], skipped: Skipped) -> Iterator[ToolRun]:
    """Aider's chat history: its own notes are `> ` lines, each model call's ends with `> Tokens: ...`, and the
    runs its reply led to follow (io.tool_output in aider/coders/base_coder.py). A session's first note is its
    command line, which says whether it tests after an edit (`--auto-test`, `--test-cmd`). Aider says nothing of a
    test that passed (it asks to fix one that failed), nor of a lint that passed: a reply's applied edit with
    `--auto-test` and no failure said is a passing test; a lint run is recorded only when it failed."""
    reply = -1  # the index among the session's calls of the reply the notes below follow
    tests, test_command, argv_read = False, "", False
    edited = False  # an edit of this reply applied: its test ran after it
    failed: list[str] | None = None  # a reply's edits did not apply: the paths its error names, once read

    def flush() -> list[ToolRun]:
        nonlocal edited, failed
        runs = []
        if failed is not None:
            runs.append(ToolRun("edit", "error", " ".join(failed), ordinal=reply, ordinal_of=()))
        if edited and tests:
            runs.append(ToolRun("test", "ok", test_command, ordinal=reply, ordinal_of=()))
        edited, failed = False, None
        return runs

    for raw in _lines(stream, skipped):
        line = raw.decode(errors="replace").rstrip()
        note = line[2:] if line.startswith("> ") else None
        if line.startswith("# aider chat started at"):
            yield from flush()
            reply, tests, test_command, argv_read = -1, False, "", False
        elif note is not None and not argv_read:  # its command line, as Aider joins it (unquoted)
            argv_read, argv = True, f" {note} "
            tests = " --auto-test " in argv
            test_command = argv.partition(" --test-cmd ")[2].partition(" --")[0].strip()
        elif note is not None and note.startswith("Tokens: "):
            yield from flush()
            reply += 1
        elif reply < 0:
            continue
        elif failed is not None and "failed to exactly match lines in " in line:
            failed.append(line.rpartition(" lines in ")[2].strip())
        elif note is None:
            continue
        elif note.startswith("Applied edit to "):
            edited = True
            yield ToolRun("edit", "ok", note.removeprefix("Applied edit to "), ordinal=reply, ordinal_of=())
        elif note.startswith("The LLM did not conform to the edit format"):
            failed = []
        elif note.startswith("Attempt to fix lint errors?"):
            yield ToolRun("lint", "error", ordinal=reply, ordinal_of=())
        elif note.startswith("Attempt to fix test errors?"):
            edited = False  # its test ran and failed
            yield ToolRun("test", "error", test_command, ordinal=reply, ordinal_of=())
    yield from flush()


READERS = {
    "claude-code": _claude_code,
    "codex": _codex,
    "opencode": _opencode,
    "mini-swe-agent": _mini_swe_agent,
    "qwen-code": _qwen_code,
    "aider": _aider,
}
