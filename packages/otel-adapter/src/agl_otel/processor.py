"""`AglSpanProcessor`: an OpenTelemetry span processor that turns a framework's agent spans into agl agent scopes
and its tool spans into agl tool spans (agl_otel.conventions says which spans are which).

Why a span processor: OpenTelemetry calls `on_start` synchronously inside `tracer.start_span`, in the context of
the code that starts the span, before `start_as_current_span` / `use_span` make it current there. Making the
agent the acting agl agent in `on_start` (a context variable, like OpenTelemetry's own current span) puts its
name exactly where the agent's span is current: the code under it, tasks created from there, and threads the
framework starts with the context copied (as it must for its own spans to nest). Nested agents each set their
own, so a call is stored under the innermost. `on_end` runs when the span ends, normally back in the same
context, and resets it; a span ended in another context leaves that context's value to die with it.

Tools are recognised when their span ends (a framework may set the tool's attributes or its error status only
then) and recorded with the rollout and agent seen when it started, wherever it ends.

Outside an agl rollout the processor does nothing, so an instrumented app runs unchanged when nobody trains it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import StatusCode

import agl
from agl.capture.tracing.context import (
    AgentToken,
    RolloutContext,
    current_agent,
    current_rollout,
    enter_agent,
    exit_agent,
)
from agl_otel.conventions import Match, error_type, match

_NS = 1e-9


@dataclass
class _Started:
    """What a span started inside a rollout needs at its end: the rollout, the acting agent, and for an agent
    span its match and the token that undoes its scope."""

    ctx: RolloutContext
    agent: str | None
    agent_match: Match | None = None
    token: AgentToken | None = None


class AglSpanProcessor(SpanProcessor):
    """Agent spans become agl agent scopes; tool spans become agl tool spans with ok/error status.

    `enabled` is what `uninstrument()` turns off: the OpenTelemetry SDK has no way to take a processor out of a
    tracer provider, so a disabled one stays registered and does nothing."""

    def __init__(self) -> None:
        self.enabled = True
        self._started: dict[int, _Started] = {}  # span id → what its end needs
        self._lock = threading.Lock()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        if not self.enabled:
            return
        ctx = current_rollout()
        if ctx is None:
            return
        ctx.saw_framework_span(span.name)
        started = _Started(ctx, current_agent())
        found = match(span.name, span.attributes, "agent")
        if found is not None:
            started.agent_match = found
            started.token = enter_agent(found.name, found.key)
        span_id = span.get_span_context().span_id
        with self._lock:
            self._started[span_id] = started

    def on_end(self, span: ReadableSpan) -> None:
        context = span.get_span_context()
        if context is None:
            return
        with self._lock:
            started = self._started.pop(context.span_id, None)
        if started is None:
            return
        if started.token is not None:
            exit_agent(started.token)
        if not self.enabled:
            return
        if started.agent_match is not None:
            _record_agent(span, started.agent_match, started.ctx)
            return
        tool = match(span.name, span.attributes, "tool")
        if tool is not None:
            _record_tool(span, tool, started)

    def shutdown(self) -> None:
        with self._lock:
            self._started.clear()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True  # spans go to the rollout's recorder, which the agl runner sends


def _times(span: ReadableSpan) -> tuple[float, float | None]:
    start = (span.start_time or 0) * _NS
    return start, None if span.end_time is None else span.end_time * _NS


def _failure(span: ReadableSpan, found: Match) -> str | None:
    """Why the span failed, or None if it did not: its status description, else the exception it recorded
    (frameworks set status ERROR without a description and record the exception as an event), else the error
    type its attributes name."""
    named = error_type(span.attributes, found.convention)
    if span.status.status_code is not StatusCode.ERROR and named is None:
        return None
    if span.status.description:
        return span.status.description
    for event in reversed(span.events):
        if event.name == "exception" and event.attributes:
            kind, message = event.attributes.get("exception.type"), event.attributes.get("exception.message")
            if kind or message:
                return f"{kind}: {message}" if kind and message else str(kind or message)
    return named or "error"


def _record_agent(span: ReadableSpan, found: Match, ctx: RolloutContext) -> None:
    start, end = _times(span)
    failure = _failure(span, found)
    attributes: dict[str, Any] = {"otel.convention": found.convention.source, "otel.span_name": span.name}
    if found.key is not None:
        attributes["otel.agent_id"] = found.key
    agl.record_span(
        f"agent:{found.name}",
        kind="agent",
        start_time=start,
        end_time=end,
        status="error" if failure is not None else "ok",
        status_message=failure,
        attributes=attributes,
        agent_name=found.name,
        ctx=ctx,
    )


def _record_tool(span: ReadableSpan, found: Match, started: _Started) -> None:
    start, end = _times(span)
    agl.record_tool(
        found.name,
        start_time=start,
        end_time=end,
        error=_failure(span, found),
        call_id=found.call_id,
        arguments=found.arguments,
        result=found.result,
        agent_name=started.agent,
        ctx=started.ctx,
    )
