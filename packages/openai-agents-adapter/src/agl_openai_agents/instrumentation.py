"""`instrument()` / `uninstrument()`: put agl's tracing processor in the SDK's trace pipeline, and take it out.

The SDK's default processor exports every trace to OpenAI's tracing backend. During training that would send
the rollouts' traces (and, from a worker without a real key, error logs) to OpenAI, so `instrument()` wraps it
in `OutsideRollouts`: inside an agl rollout nothing reaches it; the same app run by hand exports as before.

It also wraps the one function through which the SDK (0.20 to 0.24 at least) hands a failed tool's exception to
the tool's `failure_error_function`, whose return value is the message the model gets. Since openai-agents 0.21
the SDK's span no longer carries the exception's text ("Error details are redacted"), and the default message
the model gets does not either; the wrapper passes the exception to `note_tool_failure` for agl's tool span and
then calls the SDK's function unchanged, so the model sees exactly what it would have. Wrapping that function,
rather than each tool's `failure_error_function` or `on_invoke_tool`, reaches every function tool (already built
ones included, and agents called as tools) without touching the app's tools, and leaves the SDK's own
redaction, which checks the formatter's identity, as it was.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

from agents.tracing import Span, Trace, TracingProcessor, get_trace_provider, set_trace_processors
from agents.tracing.processors import default_processor

from agl.capture.instrumentation import Instrumentor
from agl.capture.tracing.context import current_rollout
from agl_openai_agents.processor import AglTracingProcessor, note_tool_failure

log = logging.getLogger(__name__)

_FailureHandler = Callable[..., Awaitable[str | None]]
_FAILURE_HANDLER = "maybe_invoke_function_tool_failure_error_function"
# `agents.tool` calls it for a tool that raised; `tool_execution` imported a binding of its own, which it calls
# for a tool task that was cancelled.
_FAILURE_HANDLER_MODULES = ("agents.tool", "agents.run_internal.tool_execution")


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


class OpenAIAgentsInstrumentor(Instrumentor):
    """agl's processor in the SDK's trace pipeline and the tool failure handler wrapped (see the module's
    docstring); `agl_openai_agents.instrument()` runs this one."""

    dependencies: ClassVar[dict[str, str]] = {"agents": "'openai-agents>=0.20,<1'"}
    names_agents = True  # the worker warns when a rollout's calls got no agent name from it
    processor: AglTracingProcessor | None = None

    def _instrument(self) -> None:
        processors = _current_processors()
        if os.environ.get("OPENAI_AGENTS_DISABLE_TRACING", "").lower() in ("1", "true"):
            log.warning(
                "OPENAI_AGENTS_DISABLE_TRACING is set: agl sees agent steps through the SDK's tracing, so LLM "
                "calls will be stored unattributed and no tool spans recorded"
            )
        exporter = default_processor()
        wrapped = [OutsideRollouts(p) if p is exporter else p for p in processors]
        self.processor = AglTracingProcessor()
        set_trace_processors([self.processor, *wrapped])
        self._wrap_failure_handlers()

    def _uninstrument(self) -> None:
        installed, self.processor = self.processor, None
        if installed is None:
            return
        restored = [
            p.inner if isinstance(p, OutsideRollouts) else p for p in _current_processors() if p is not installed
        ]
        set_trace_processors(restored)

    def _in_place(self) -> bool:
        # `set_trace_processors` by the user drops agl's processor: then `instrument()` puts it back
        return self.processor is not None and self.processor in _current_processors()

    def _wrap_failure_handlers(self) -> None:
        wrapped_tool = False
        for name in _FAILURE_HANDLER_MODULES:
            try:
                module = importlib.import_module(name)
            except ImportError:
                continue
            if getattr(module, _FAILURE_HANDLER, None) is None:
                continue
            # The undo puts the SDK's function back over agl's wrapper only, never over what someone set since.
            self.wrap(module, _FAILURE_HANDLER, _keeping_the_reason)
            wrapped_tool = wrapped_tool or name == "agents.tool"
        if not wrapped_tool:
            log.warning(
                "this openai-agents version has no agents.tool.%s: a failed tool's span will carry only the reason "
                "the SDK's own span gives (redacted since openai-agents 0.21)",
                _FAILURE_HANDLER,
            )


def instrument() -> None:
    """Attribute each SDK agent's LLM calls to its `Agent.name` and record tool and handoff spans for agl.

    Idempotent (a second call changes nothing) and cheap, so it may be called at start-up or at the top of a
    rollout function. Processors you register later are kept; `set_trace_processors` after this call would
    drop agl's: call `instrument()` again afterwards. `uninstrument()` undoes it.
    """
    OpenAIAgentsInstrumentor().instrument()


def uninstrument() -> None:
    """Take agl's processor out and give the SDK's OpenAI exporter back its traces. Idempotent."""
    OpenAIAgentsInstrumentor().uninstrument()


def is_instrumented() -> bool:
    """Whether agl's processor is in the SDK's trace pipeline now."""
    return OpenAIAgentsInstrumentor().is_instrumented()


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


def _keeping_the_reason(handler: _FailureHandler) -> _FailureHandler:
    @functools.wraps(handler)
    async def wrapper(*args: Any, **kwargs: Any) -> str | None:
        # Keyword-only in the SDK (`function_tool=, context=, error=`); forwarded untouched either way.
        error = kwargs.get("error")
        if isinstance(error, BaseException):
            note_tool_failure(error, kwargs.get("context"))
        return await handler(*args, **kwargs)

    return wrapper
