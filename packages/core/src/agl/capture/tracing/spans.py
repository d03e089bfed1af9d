"""The built-in lightweight tracer: spans, agent scopes and rewards without the OpenTelemetry SDK.

Spans are buffered in the rollout's recorder and sent by the runner in batches; they end in the store in
the same shape as spans that arrive over OTLP. Outside a rollout every call here is a cheap no-op (and
`emit_reward` logs a warning once), so an agent instrumented with agl runs unchanged when nobody trains it.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from agl.capture.tracing.context import (
    SPAN_VAR,
    RolloutContext,
    current_agent,
    current_rollout,
    current_span_id,
    enter_agent,
    exit_agent,
    new_span_id,
)
from agl.common import attributes as attr
from agl.schema import RewardIn, RewardSource, SpanIn, SpanStatus

log = logging.getLogger(__name__)
_warned_outside = False


class SpanHandle:
    """The open span a `with agl.span(...)` block works in."""

    __slots__ = ("attributes", "events", "span_id", "status", "status_message")

    def __init__(self, span_id: str, attributes: dict[str, Any]) -> None:
        self.span_id = span_id
        self.attributes = attributes
        self.status = SpanStatus.unset
        self.status_message: str | None = None
        self.events: list[dict[str, Any]] = []

    def set_attribute(self, key: str, value: Any) -> None:
        self.attributes[key] = value

    def set_status(self, status: str | SpanStatus, message: str | None = None) -> None:
        self.status = SpanStatus(status)
        self.status_message = message

    def add_event(self, name: str, attributes: Mapping[str, Any] | None = None) -> None:
        self.events.append({"name": name, "time": time.time(), "attributes": dict(attributes or {})})


@contextmanager
def span(name: str, *, kind: str = "custom", attributes: Mapping[str, Any] | None = None) -> Iterator[SpanHandle]:
    """Record a span around a block. An exception escaping the block marks it `error` and is re-raised."""
    ctx = current_rollout()
    handle = SpanHandle(new_span_id(), dict(attributes or {}))
    if ctx is None:
        yield handle
        return
    parent = current_span_id()
    token = SPAN_VAR.set(handle.span_id)
    start = time.time()
    try:
        yield handle
    except BaseException as exc:
        handle.set_status(SpanStatus.error, f"{type(exc).__name__}: {exc}")
        raise
    else:
        if handle.status is SpanStatus.unset:
            handle.status = SpanStatus.ok
    finally:
        SPAN_VAR.reset(token)
        agent = current_agent()
        handle.attributes.update(
            {attr.SPAN_KIND: kind, attr.ROLLOUT_ID: ctx.rollout_id, attr.ATTEMPT_ID: ctx.attempt_id}
        )
        if agent is not None:
            handle.attributes[attr.AGENT_NAME] = agent
        if ctx.last_llm_seq is not None:
            handle.attributes[attr.AFTER_LLM_SEQ] = ctx.last_llm_seq
        ctx.recorder.add_span(
            SpanIn(
                trace_id=ctx.trace_id,
                span_id=handle.span_id,
                parent_id=parent,
                name=name,
                kind="internal",
                start_time=start,
                end_time=max(time.time(), start),
                attributes=handle.attributes,
                status=handle.status,
                status_message=handle.status_message,
                events=handle.events,
                rollout_id=ctx.rollout_id,
                attempt_id=ctx.attempt_id,
                agent_name=agent,
                source="agl",
            )
        )


@contextmanager
def agent(name: str, *, key: str | None = None, **attributes: Any) -> Iterator[SpanHandle]:
    """Say which agent is acting: LLM calls made inside are attributed to `name` by the proxy.

    Works in sync, async (each task keeps its own scope), threaded (each thread its own) and streaming code
    (the name is read when the request is sent). Scopes nest: the innermost name wins. `key`: a stable second
    name that training selection also matches (see `enter_agent`).
    """
    token = enter_agent(name, key)
    if key:
        attributes = {attr.AGENT_KEY: key, **attributes}
    try:
        with span(f"agent:{name}", kind="agent", attributes=attributes) as handle:
            yield handle
    finally:
        exit_agent(token)


@contextmanager
def tool(name: str, *, call_id: str | None = None, arguments: Any = None) -> Iterator[SpanHandle]:
    """Record a tool execution as a span whose status (ok / error) AIR rules can read."""
    attrs: dict[str, Any] = {attr.TOOL_NAME: name}
    if call_id is not None:
        attrs[attr.TOOL_CALL_ID] = call_id
    if arguments is not None:
        attrs[attr.TOOL_ARGUMENTS] = arguments if isinstance(arguments, str) else repr(arguments)
    with span(f"tool:{name}", kind="tool", attributes=attrs) as handle:
        yield handle


def record_span(
    name: str,
    *,
    kind: str,
    start_time: float,
    end_time: float | None = None,
    status: str | SpanStatus = SpanStatus.ok,
    status_message: str | None = None,
    attributes: Mapping[str, Any] | None = None,
    agent_name: str | None = None,
    parent_id: str | None = None,
    ctx: RolloutContext | None = None,
) -> str | None:
    """Record a span that already ended, for framework hooks that report `start` and `end` as two callbacks
    (possibly on different threads, where a `with` block cannot span both). `ctx` is the rollout to record it
    in (the current one by default: a hook on a framework thread passes the one it saw at the start).
    Returns the span id, or None outside a rollout."""
    ctx = ctx or current_rollout()
    if ctx is None:
        return None
    agent = agent_name if agent_name is not None else current_agent()
    attrs = dict(attributes or {})
    attrs.update({attr.SPAN_KIND: kind, attr.ROLLOUT_ID: ctx.rollout_id, attr.ATTEMPT_ID: ctx.attempt_id})
    if agent is not None:
        attrs[attr.AGENT_NAME] = agent
    if ctx.last_llm_seq is not None:
        attrs[attr.AFTER_LLM_SEQ] = ctx.last_llm_seq
    span_id = new_span_id()
    end = time.time() if end_time is None else end_time
    ctx.recorder.add_span(
        SpanIn(
            trace_id=ctx.trace_id,
            span_id=span_id,
            parent_id=parent_id if parent_id is not None else current_span_id(),
            name=name,
            kind="internal",
            start_time=start_time,
            end_time=max(end, start_time),
            attributes=attrs,
            status=SpanStatus(status),
            status_message=status_message,
            events=[],
            rollout_id=ctx.rollout_id,
            attempt_id=ctx.attempt_id,
            agent_name=agent,
            source="agl",
        )
    )
    return span_id


def record_tool(
    name: str,
    *,
    start_time: float,
    end_time: float | None = None,
    error: str | None = None,
    call_id: str | None = None,
    arguments: Any = None,
    result: Any = None,
    agent_name: str | None = None,
    parent_id: str | None = None,
    ctx: RolloutContext | None = None,
) -> str | None:
    """Record a finished tool execution (status `error` with `error` as its message, else `ok`): the same span
    `agl.tool` makes, for hooks that see a tool's start and end separately."""
    attrs: dict[str, Any] = {attr.TOOL_NAME: name}
    if call_id is not None:
        attrs[attr.TOOL_CALL_ID] = call_id
    if arguments is not None:
        attrs[attr.TOOL_ARGUMENTS] = arguments if isinstance(arguments, str) else repr(arguments)
    if result is not None:
        attrs[attr.TOOL_RESULT] = result if isinstance(result, str) else repr(result)
    return record_span(
        f"tool:{name}",
        kind="tool",
        start_time=start_time,
        end_time=end_time,
        status=SpanStatus.error if error is not None else SpanStatus.ok,
        status_message=error,
        attributes=attrs,
        agent_name=agent_name,
        parent_id=parent_id,
        ctx=ctx,
    )


def emit_reward(
    value: float, name: str = "reward", *, source: RewardSource = RewardSource.explicit, **metadata: Any
) -> None:
    """Record a reward at this point of the run (after the LLM calls answered so far)."""
    global _warned_outside
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"reward {name!r} must be a number, got {type(value).__name__}") from None
    if not math.isfinite(value):
        raise ValueError(f"reward {name!r} must be finite, got {value}")
    ctx = current_rollout()
    if ctx is None:
        if not _warned_outside:
            log.warning("agl.emit_reward(%r) called outside a rollout: ignored", name)
            _warned_outside = True
        return
    ctx.recorder.add_reward(
        RewardIn(
            rollout_id=ctx.rollout_id,
            attempt_id=ctx.attempt_id,
            value=value,
            name=name,
            source=source,
            after_llm_seq=ctx.last_llm_seq,
            span_id=current_span_id(),
            agent_name=current_agent(),
            timestamp=time.time(),
            metadata=metadata,
            uid=uuid.uuid4().hex,
        )
    )
