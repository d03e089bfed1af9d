"""`AglTracingProcessor`: turns the OpenAI Agents SDK's own trace spans into agl agent scopes and tool spans.

Why a tracing processor: the SDK starts an `AgentSpanData` span (`span.start(mark_as_current=True)`) in the run
loop's context before it creates the task that calls the model, and finishes it in that same context after the
agent's last turn or at a handoff. Processors are called synchronously from `start()` / `finish()`, so making
the agent the current agl agent in `on_span_start` puts its name in exactly the context (and every task created
from it: model calls, tool calls, nested runs) where the SDK sends the model's HTTP request. This holds for
`Runner.run`, `run_sync` and `run_streamed` (the last two run the same loop in a task of their own); runs made
at the same time live in different asyncio tasks or threads, each with its own context, so they never see each
other's agent.
"""

from __future__ import annotations

import contextvars
import threading
import time
from datetime import datetime
from typing import Any

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
from agl.tracing.context import current_rollout, enter_agent, exit_agent


class AglTracingProcessor(TracingProcessor):
    """A `TracingProcessor` that names the acting agent for agl and records agent, tool and handoff spans.

    Outside an agl rollout it does nothing, so an instrumented app runs unchanged when nobody trains it.
    """

    def __init__(self) -> None:
        # Agent span id -> the token that undoes `enter_agent`; spans may start and end on any thread.
        self._agent_tokens: dict[str, contextvars.Token[str | None]] = {}
        self._lock = threading.Lock()

    def on_trace_start(self, trace: Trace) -> None:
        pass

    def on_trace_end(self, trace: Trace) -> None:
        pass

    def on_span_start(self, span: Span[Any]) -> None:
        data = span.span_data
        if isinstance(data, AgentSpanData) and data.name and current_rollout() is not None:
            token = enter_agent(data.name)
            with self._lock:
                self._agent_tokens[span.span_id] = token

    def on_span_end(self, span: Span[Any]) -> None:
        data = span.span_data
        if isinstance(data, AgentSpanData):
            with self._lock:
                token = self._agent_tokens.pop(span.span_id, None)
            if token is not None:
                exit_agent(token)
                _record_agent(span, data)
        elif isinstance(data, FunctionSpanData):
            _record_function(span, data)
        elif isinstance(data, HandoffSpanData):
            _record_handoff(span, data)

    def shutdown(self) -> None:
        with self._lock:
            self._agent_tokens.clear()

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


def _record_function(span: Span[Any], data: FunctionSpanData) -> None:
    # The SDK catches a tool's exception (its `failure_error_function` turns it into a message for the model)
    # but still attaches a SpanError to the function span: that is the only sign the call failed.
    agl.record_tool(
        data.name,
        start_time=_timestamp(span.started_at),
        end_time=_timestamp(span.ended_at),
        error=_error_message(span.error) if span.error else None,
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
