"""`instrument()` / `uninstrument()`: put agl's tracing processor in the SDK's trace pipeline, and take it out.

The SDK's default processor exports every trace to OpenAI's tracing backend. During training that would send
the rollouts' traces (and, from a worker without a real key, error logs) to OpenAI, so `instrument()` wraps it
in `OutsideRollouts`: inside an agl rollout nothing reaches it; the same app run by hand exports as before.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from agents.tracing import Span, Trace, TracingProcessor, get_trace_provider, set_trace_processors
from agents.tracing.processors import default_processor

from agl.tracing.context import current_rollout
from agl_openai_agents.processor import AglTracingProcessor

log = logging.getLogger(__name__)

_lock = threading.Lock()
_installed: AglTracingProcessor | None = None


class OutsideRollouts(TracingProcessor):
    """Forwards to `inner` only what happens outside agl rollouts (used for the SDK's OpenAI exporter)."""

    def __init__(self, inner: TracingProcessor) -> None:
        self.inner = inner
        # Traces begun inside a rollout: their spans are held back even if one ends in a context (a thread
        # started by hand) that does not carry the rollout.
        self._rollout_traces: set[str] = set()
        self._lock = threading.Lock()

    def _in_rollout(self, trace_id: str) -> bool:
        with self._lock:
            return current_rollout() is not None or trace_id in self._rollout_traces

    def on_trace_start(self, trace: Trace) -> None:
        if current_rollout() is not None:
            with self._lock:
                self._rollout_traces.add(trace.trace_id)
            return
        self.inner.on_trace_start(trace)

    def on_trace_end(self, trace: Trace) -> None:
        with self._lock:
            held_back = trace.trace_id in self._rollout_traces
            self._rollout_traces.discard(trace.trace_id)
        if not held_back and current_rollout() is None:
            self.inner.on_trace_end(trace)

    def on_span_start(self, span: Span[Any]) -> None:
        if not self._in_rollout(span.trace_id):
            self.inner.on_span_start(span)

    def on_span_end(self, span: Span[Any]) -> None:
        if not self._in_rollout(span.trace_id):
            self.inner.on_span_end(span)

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self) -> None:
        self.inner.force_flush()


def instrument() -> None:
    """Attribute each SDK agent's LLM calls to its `Agent.name` and record tool and handoff spans for agl.

    Idempotent (a second call changes nothing) and cheap, so it may be called at start-up or at the top of a
    rollout function. Processors you register later are kept; `set_trace_processors` after this call would
    drop agl's: call `instrument()` again afterwards. `uninstrument()` undoes it.
    """
    global _installed
    with _lock:
        processors = _current_processors()
        if _installed is not None and _installed in processors:
            return
        if os.environ.get("OPENAI_AGENTS_DISABLE_TRACING", "").lower() in ("1", "true"):
            log.warning(
                "OPENAI_AGENTS_DISABLE_TRACING is set: agl sees agent steps through the SDK's tracing, so LLM "
                "calls will be stored unattributed and no tool spans recorded"
            )
        exporter = default_processor()
        wrapped = [OutsideRollouts(p) if p is exporter else p for p in processors]
        _installed = AglTracingProcessor()
        set_trace_processors([_installed, *wrapped])


def uninstrument() -> None:
    """Take agl's processor out and give the SDK's OpenAI exporter back its traces. Idempotent."""
    global _installed
    with _lock:
        if _installed is None:
            return
        installed, _installed = _installed, None
        restored = [
            p.inner if isinstance(p, OutsideRollouts) else p for p in _current_processors() if p is not installed
        ]
        set_trace_processors(restored)


def is_instrumented() -> bool:
    """Whether agl's processor is in the SDK's trace pipeline now."""
    with _lock:
        return _installed is not None and _installed in _current_processors()


def _current_processors() -> list[TracingProcessor]:
    # The SDK has no public getter for its processor list; its default provider keeps it here. Reading it
    # lets `instrument()` keep the processors the user registered, and `uninstrument()` restore them.
    provider = get_trace_provider()
    processors = getattr(getattr(provider, "_multi_processor", None), "_processors", None)
    if processors is None:
        raise TypeError(
            f"agl_openai_agents.instrument() needs the SDK's default trace provider, not {type(provider).__name__}; "
            "with a custom provider, register agl_openai_agents.AglTracingProcessor() yourself"
        )
    return list(processors)
