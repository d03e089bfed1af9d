"""Turn CrewAI's tool events into agl tool spans with status ok / error.

CrewAI reports each tool execution as a start event followed by exactly one end event: `ToolUsageFinishedEvent`
(which carries `failure` when the tool returned a `ToolFailure` or the model named a tool that does not exist)
or `ToolUsageErrorEvent` (the tool raised; CrewAI catches it and feeds the error text to the model, so nothing
else would show the call failed). In its text (ReAct) loop a call of an unknown tool or with unusable arguments
is reported by `ToolSelectionErrorEvent` / `ToolValidateInputErrorEvent` alone, without a start.

Handlers run on CrewAI's thread pool inside a copy of the emitting context, so `agl.current_rollout()` there is
the rollout the tool ran in and `agl.current_agent()` the agent scope it ran under; the span is recorded into that
rollout explicitly (`ctx=`). Handlers of one call may run in either order: an end never waits for its start.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from datetime import datetime
from typing import Any

from crewai.events.types.tool_usage_events import (
    ToolSelectionErrorEvent,
    ToolUsageErrorEvent,
    ToolUsageEvent,
    ToolUsageFinishedEvent,
    ToolUsageStartedEvent,
    ToolValidateInputErrorEvent,
)
from crewai.tools.tool_failure import ToolFailure

import agl
from agl_crewai.agent_scopes import name_of_role


class ToolStarts:
    """When each open tool call started, by its start event's id; only an error event needs it (a finished event
    carries its own times). Bounded: a start whose end never comes (a run that died) is forgotten eventually."""

    def __init__(self, limit: int = 4096) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._started: OrderedDict[str, float] = OrderedDict()

    def add(self, event_id: str, started: float) -> None:
        with self._lock:
            self._started[event_id] = started
            while len(self._started) > self._limit:
                self._started.popitem(last=False)

    def pop(self, event_id: str | None) -> float | None:
        if event_id is None:
            return None
        with self._lock:
            return self._started.pop(event_id, None)


def on_started(starts: ToolStarts, event: ToolUsageStartedEvent) -> None:
    if agl.current_rollout() is not None:
        starts.add(event.event_id, _epoch(event.timestamp))


def on_finished(starts: ToolStarts, event: ToolUsageFinishedEvent) -> None:
    starts.pop(event.started_event_id)
    _record(
        event,
        start=_epoch(event.started_at),
        end=_epoch(event.finished_at),
        error=_failure_message(event.failure) if event.failure is not None else None,
        result=event.output,
    )


def on_error(starts: ToolStarts, event: ToolUsageErrorEvent) -> None:
    end = _epoch(event.timestamp)
    started = starts.pop(event.started_event_id)
    # The start's handler may not have run yet (handlers run in parallel): then the span is as short as can be
    # known, but its status, which is what rewards read, is right.
    _record(event, start=started if started is not None else end, end=end, error=_error_message(event.error))


def on_rejected(event: ToolSelectionErrorEvent | ToolValidateInputErrorEvent) -> None:
    at = _epoch(event.timestamp)
    _record(event, start=at, end=at, error=_error_message(event.error))


def _record(event: ToolUsageEvent, *, start: float, end: float, error: str | None, result: Any = None) -> None:
    ctx = agl.current_rollout()
    if ctx is None:
        return
    agl.record_tool(
        event.tool_name,
        start_time=start,
        end_time=end,
        error=error,
        arguments=_as_text(event.tool_args),
        result=_as_text(result) if result is not None else None,
        # the scope the tool ran in; the event's own role when CrewAI ran the tool outside an agent's work
        agent_name=agl.current_agent() or name_of_role(event.agent_role),
        ctx=ctx,
    )


def _epoch(moment: datetime) -> float:
    # CrewAI stamps `timestamp` in UTC and `started_at` / `finished_at` in naive local time; both convert right.
    return moment.timestamp()


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, default=str, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)


def _error_message(error: Any) -> str:
    if isinstance(error, BaseException):
        return f"{type(error).__name__}: {error}"
    return str(error) or "tool error"


def _failure_message(failure: ToolFailure) -> str:
    return f"{failure.reason.value}: {failure.as_agent_message()}"
