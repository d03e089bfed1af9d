"""`AglTracingProcessor`: turns the OpenAI Agents SDK's own trace spans into agl agent scopes and tool spans.

Why a tracing processor: the SDK starts an `AgentSpanData` span (`span.start(mark_as_current=True)`) in the run
loop's context before it creates the task that calls the model, and finishes it in that same context after the
agent's last turn or at a handoff. Processors are called synchronously from `start()` / `finish()`, so making
the agent the current agl agent in `on_span_start` puts its name in exactly the context (and every task created
from it: model calls, tool calls, nested runs) where the SDK sends the model's HTTP request. This holds for
`Runner.run`, `run_sync` and `run_streamed` (the last two run the same loop in a task of their own); runs made
at the same time live in different asyncio tasks or threads, each with its own context, so they never see each
other's agent.

The same holds for a function span: the SDK starts it in the task that runs that one tool call, then creates the
task that invokes the tool from there. `on_span_start` puts a fresh `_ToolFailure` in that context, so the hook
`instrument()` installs on the SDK's failure handling (`note_tool_failure`) fills the holder of exactly the call
that failed, however many tools, runs and rollouts run at once.
"""

from __future__ import annotations

import contextvars
import threading
import time
from datetime import datetime
from typing import Any

from agents.run_context import RunContextWrapper
from agents.tool_context import ToolContext
from agents.tracing import (
    AgentSpanData,
    FunctionSpanData,
    HandoffSpanData,
    Span,
    SpanError,
    Trace,
    TracingProcessor,
)

import agl
from agl.capture.tracing.context import AgentToken, current_rollout, enter_agent, exit_agent


class _ToolFailure:
    """Why the tool call of one function span failed, once `note_tool_failure` has been told.

    A holder rather than a value in the context variable: the SDK invokes the tool in a task of its own, whose
    context is a copy, so a value set there would never reach `on_span_end`; a change to a shared holder does.
    """

    __slots__ = ("reason",)

    def __init__(self) -> None:
        self.reason: str | None = None


# The holder of the function span being run in this context: set only inside an agl rollout, so outside one
# `note_tool_failure` finds nothing and does nothing.
_tool_failure: contextvars.ContextVar[_ToolFailure | None] = contextvars.ContextVar(
    "agl_openai_agents_tool_failure", default=None
)


def note_tool_failure(error: BaseException, context: RunContextWrapper[Any] | None) -> None:
    """Keep `error` as the reason the current tool call failed (the SDK is about to turn it into the model's
    message). Since openai-agents 0.21 the SDK's own span only says "Error details are redacted", so this is
    where agl's tool span gets its reason from."""
    failure = _tool_failure.get()
    if failure is None:
        return
    run_config = context.run_config if isinstance(context, ToolContext) else None
    if run_config is not None and not run_config.trace_include_sensitive_data:
        # The app asked to keep tool data out of traces: the exception's type says what failed, not with what.
        failure.reason = type(error).__name__
        return
    try:
        text = str(error)
    except Exception:  # a broken __str__ must not break the app's run
        text = ""
    failure.reason = f"{type(error).__name__}: {text}" if text else type(error).__name__


class AglTracingProcessor(TracingProcessor):
    """A `TracingProcessor` that names the acting agent for agl and records agent, tool and handoff spans.

    Outside an agl rollout it does nothing, so an instrumented app runs unchanged when nobody trains it.
    """

    def __init__(self) -> None:
        # Agent span id -> the token that undoes `enter_agent`; spans may start and end on any thread.
        self._agent_tokens: dict[str, AgentToken] = {}
        # Function span id -> its failure holder and the token that takes it out of the context again.
        self._tool_failures: dict[str, tuple[_ToolFailure, contextvars.Token[_ToolFailure | None]]] = {}
        self._lock = threading.Lock()

    def on_trace_start(self, trace: Trace) -> None:
        pass

    def on_trace_end(self, trace: Trace) -> None:
        pass

    def on_span_start(self, span: Span[Any]) -> None:
        data = span.span_data
        if current_rollout() is None:
            return
        if isinstance(data, AgentSpanData) and data.name:
            token = enter_agent(data.name)
            with self._lock:
                self._agent_tokens[span.span_id] = token
        elif isinstance(data, FunctionSpanData):
            failure = _ToolFailure()
            tool_token = _tool_failure.set(failure)
            with self._lock:
                self._tool_failures[span.span_id] = (failure, tool_token)

    def on_span_end(self, span: Span[Any]) -> None:
        data = span.span_data
        if isinstance(data, AgentSpanData):
            with self._lock:
                token = self._agent_tokens.pop(span.span_id, None)
            if token is not None:
                exit_agent(token)
                _record_agent(span, data)
        elif isinstance(data, FunctionSpanData):
            with self._lock:
                failure, tool_token = self._tool_failures.pop(span.span_id, (None, None))
            if tool_token is not None:
                try:
                    _tool_failure.reset(tool_token)
                except ValueError:  # ended in another context than it started in: that context keeps it
                    pass
            _record_function(span, data, failure.reason if failure else None)
        elif isinstance(data, HandoffSpanData):
            _record_handoff(span, data)

    def shutdown(self) -> None:
        with self._lock:
            self._agent_tokens.clear()
            self._tool_failures.clear()

    def force_flush(self) -> None:
        pass  # spans go to the rollout's recorder, which the agl runner sends


def _record_agent(span: Span[Any], data: AgentSpanData) -> None:
    agl.record_span(
        f"agent:{data.name}",
        kind="agent",
        start_time=_timestamp(span.started_at),
        end_time=_timestamp(span.ended_at),
        status="error" if span.error else "ok",
        status_message=_error_message(span.error),
        attributes={"openai_agents.handoffs": list(data.handoffs or []), "openai_agents.tools": list(data.tools or [])},
        agent_name=data.name,
    )


def _record_function(span: Span[Any], data: FunctionSpanData, reason: str | None) -> None:
    # The SDK catches a tool's exception (its `failure_error_function` turns it into a message for the model)
    # but still attaches a SpanError to the function span. Its text is redacted since openai-agents 0.21, so
    # the reason comes from `note_tool_failure` when it saw the exception; the span's own text otherwise (a
    # failure the SDK raised itself, e.g. a rejected approval).
    if reason is None:
        error = _error_message(span.error)
    else:
        error = f"{span.error['message']}: {reason}" if span.error else reason
    agl.record_tool(
        data.name,
        start_time=_timestamp(span.started_at),
        end_time=_timestamp(span.ended_at),
        error=error,
        arguments=data.input,
        result=data.output,
    )


def _record_handoff(span: Span[Any], data: HandoffSpanData) -> None:
    agl.record_span(
        f"handoff:{data.from_agent}->{data.to_agent}",
        kind="handoff",
        start_time=_timestamp(span.started_at),
        end_time=_timestamp(span.ended_at),
        status="error" if span.error else "ok",
        status_message=_error_message(span.error),
        attributes={"openai_agents.from_agent": data.from_agent or "", "openai_agents.to_agent": data.to_agent or ""},
    )


def _timestamp(iso: str | None) -> float:
    """Seconds since the epoch of the SDK's ISO-8601 span times (now if the span has none)."""
    if iso is None:
        return time.time()
    return datetime.fromisoformat(iso).timestamp()


def _error_message(error: SpanError | None) -> str | None:
    if not error:
        return None
    detail = (error.get("data") or {}).get("error")
    return f"{error['message']}: {detail}" if detail else error["message"]
