"""Send OpenTelemetry SDK spans to the agl server, tagged with the rollout they belong to.

    from agl.capture.tracing.otel import configure_otel
    configure_otel()          # inside a rollout, or with AGL_SERVER_URL set; or configure_otel("http://host:8765")

Every span started while a rollout runs (in the runner's task, or a thread or task that inherited its context)
gets `agl.rollout_id`, `agl.attempt_id` and, inside `agl.agent(...)`, `agl.agent.name`; the server's OTLP
receiver (`/v1/traces`) files it under that rollout. Attributes the code set itself are never overwritten.

OpenTelemetry keeps choosing its own trace ids: spans are matched to rollouts by the attributes above, not by
trace id, so spans of existing OTel instrumentation (and their parent links) stay exactly as they were.

This module is only imported by code that asks for OpenTelemetry, so `import agl` does not load the SDK.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import TYPE_CHECKING

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider

from agl.capture.tracing.context import current_agent, current_rollout
from agl.common import attributes as attr

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

log = logging.getLogger(__name__)

_lock = threading.Lock()
_configure_lock = threading.Lock()
_providers: dict[str, TracerProvider] = {}  # traces endpoint -> the provider configure_otel made for it
# every provider that exports to agl (configure_otel's and the ones given to add_agl_processors) -> its exporting
# processor, which force_flush() flushes
_exporting: weakref.WeakKeyDictionary[TracerProvider, list[SpanProcessor]] = weakref.WeakKeyDictionary()


class AglAttributesProcessor(SpanProcessor):
    """Adds the current rollout's ids and agent name to each span as it starts."""

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        existing = span.attributes or {}
        ctx = current_rollout()
        if ctx is not None:
            if attr.ROLLOUT_ID not in existing:
                span.set_attribute(attr.ROLLOUT_ID, ctx.rollout_id)
            if attr.ATTEMPT_ID not in existing:
                span.set_attribute(attr.ATTEMPT_ID, ctx.attempt_id)
        agent = current_agent()
        if agent is not None and attr.AGENT_NAME not in existing:
            span.set_attribute(attr.AGENT_NAME, agent)

    def on_end(self, span: ReadableSpan) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def traces_endpoint(server_url: str | None = None) -> str:
    """`<server>/v1/traces` of the given URL, else the current rollout's server, else `AGL_SERVER_URL`."""
    if server_url is None:
        ctx = current_rollout()
        server_url = ctx.server_url if ctx is not None else os.environ.get("AGL_SERVER_URL")
    if not server_url:
        raise ValueError(
            "configure_otel needs the agl server's URL: pass server_url=..., call it inside a rollout, or set"
            " AGL_SERVER_URL"
        )
    return f"{server_url.rstrip('/')}/v1/traces"


def otlp_exporter(server_url: str | None = None, *, token: str | None = None) -> SpanExporter:
    """An OTLP/HTTP (protobuf) span exporter aimed at the agl server; `token` defaults to `AGL_TOKEN`."""
    return _exporter(traces_endpoint(server_url), token)


def _exporter(endpoint: str, token: str | None) -> SpanExporter:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    token = token or os.environ.get("AGL_TOKEN")
    return OTLPSpanExporter(endpoint=endpoint, headers={"authorization": f"Bearer {token}"} if token else None)


def add_agl_processors(
    provider: TracerProvider, server_url: str | None = None, *, token: str | None = None, batch: bool = True
) -> TracerProvider:
    """Make an existing SDK `TracerProvider` tag its spans with agl's ids and send them to the agl server.

    For code that already has a provider of its own (with its own exporters); `configure_otel` makes a new one.
    """
    return _attach(provider, traces_endpoint(server_url), token, batch)


def _attach(provider: TracerProvider, endpoint: str, token: str | None, batch: bool) -> TracerProvider:
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    exporter = _exporter(endpoint, token)
    export: SpanProcessor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
    # Processors run in the order they were added: the attributes are set before any exporter sees the span.
    provider.add_span_processor(AglAttributesProcessor())
    provider.add_span_processor(export)
    with _lock:
        _exporting.setdefault(provider, []).append(export)
    return provider


def configure_otel(
    server_url: str | None = None, *, token: str | None = None, set_global: bool = True, batch: bool = True
) -> TracerProvider:
    """A `TracerProvider` whose spans reach the agl server at `server_url`, tagged with the current rollout.

    `server_url` defaults to the current rollout's server, else `AGL_SERVER_URL`. Calling again with the same
    URL returns the same provider (the other arguments of the first call stay in force); `shutdown_otel()`
    flushes and forgets it. With `set_global`, it becomes OpenTelemetry's global provider, so instrumentation
    that calls `trace.get_tracer(...)` uses it; OpenTelemetry allows that once per process, and if another
    provider is global already, a warning says so and the provider is returned without being made global
    (use `add_agl_processors(that_provider)` instead). `batch=False` exports each span as it ends.
    """
    endpoint = traces_endpoint(server_url)
    with _configure_lock:
        provider = _providers.get(endpoint)
        if provider is None:
            provider = _attach(TracerProvider(), endpoint, token, batch)
            _providers[endpoint] = provider
        if set_global:
            _set_global(provider)
    return provider


def _set_global(provider: TracerProvider) -> None:
    from opentelemetry import trace

    current = trace.get_tracer_provider()
    if current is provider:
        return
    if isinstance(current, trace.ProxyTracerProvider):
        trace.set_tracer_provider(provider)
        if trace.get_tracer_provider() is provider:
            return
    log.warning(
        "another OpenTelemetry TracerProvider is already global and OpenTelemetry allows setting it only once:"
        " spans of instrumentation that uses the global provider will not reach agl. Call"
        " agl.capture.tracing.otel.add_agl_processors(trace.get_tracer_provider()) to send them too."
    )


def force_flush(timeout_millis: int = 30000) -> bool:
    """Send the ended spans still waiting in a batch to the agl server now; True if all went out in time.

    The runner calls this at the end of an attempt, so the spans are stored before the attempt is reported.
    Only agl's exporters are flushed (not other exporters of a provider given to `add_agl_processors`).
    A no-op (True) when neither `configure_otel` nor `add_agl_processors` was called.
    """
    with _lock:
        processors = [p for procs in _exporting.values() for p in procs]
    return all([p.force_flush(timeout_millis) for p in processors])


def shutdown_otel() -> None:
    """Flush and shut down the providers `configure_otel` made, and forget them.

    A provider that was made global stays global (OpenTelemetry cannot unset it) but exports nothing more.
    """
    with _configure_lock:
        providers = list(_providers.values())
        _providers.clear()
        with _lock:
            for provider in providers:
                _exporting.pop(provider, None)
    for provider in providers:
        provider.shutdown()
