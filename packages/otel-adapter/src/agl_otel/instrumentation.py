"""`instrument()` / `uninstrument()`: agl's span processor on the app's OpenTelemetry tracer provider.

- The app configured a provider (an SDK `TracerProvider` set globally, or one passed in): agl's processor is
  added to it. Nothing is replaced; the app's processors and exporters go on as before.
- Nothing is configured (OpenTelemetry's default proxy provider, whose spans record nothing and reach no
  processor): agl sets a `TracerProvider` of its own with only its processor, which exports nothing. Should the
  app set its provider later, which OpenTelemetry would refuse as a second one, agl's stand-in steps aside: the
  app's provider gets agl's processor and becomes the global one, as if agl had never set its own.
- `uninstrument()` disables the processor: the SDK cannot take a processor off a provider, so it stays there
  doing nothing until `instrument()` enables it again.
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from agl.capture.instrumentation import Instrumentor
from agl_otel import runtime_agents
from agl_otel.processor import AglSpanProcessor

log = logging.getLogger(__name__)


class OTelInstrumentor(Instrumentor):
    """agl's `AglSpanProcessor` on the app's tracer provider (see the module's docstring);
    `agl_otel.instrument()` runs this one."""

    dependencies: ClassVar[dict[str, str]] = {"opentelemetry.sdk": "'opentelemetry-sdk>=1.25'"}
    names_agents = True  # the worker warns when a rollout's calls got no agent name from it
    processor: AglSpanProcessor | None = None
    requested: TracerProvider | None = None  # the provider `instrument(tracer_provider=...)` named
    stand_in: TracerProvider | None = None  # the provider agl set because the app had none
    _with_processor: weakref.WeakSet[TracerProvider] | None = None

    def _instrument(self) -> None:
        if self.processor is None:  # one processor for the process: providers cannot let go of it
            self.processor = AglSpanProcessor()
            self._with_processor = weakref.WeakSet()
        self.processor.enabled = True
        runtime_agents.install()  # frameworks whose instrumentors name the agent only at a span's end
        if self.requested is not None:
            self.add_to(self.requested)
            return
        current = trace.get_tracer_provider()
        if isinstance(current, TracerProvider):
            self.add_to(current)
        elif isinstance(current, trace.ProxyTracerProvider):
            self.stand_in = TracerProvider()
            self.add_to(self.stand_in)
            trace.set_tracer_provider(self.stand_in)
            log.info("no OpenTelemetry tracer provider was set: agl set one that exports nothing")
        else:
            raise TypeError(
                f"agl_otel.instrument() adds its processor to an OpenTelemetry SDK TracerProvider, not to "
                f"{type(current).__name__}: pass yours as instrument(tracer_provider=...), or add "
                "agl_otel.AglSpanProcessor() to it yourself"
            )
        # the app's own provider, set after this, replaces the stand-in instead of being refused
        self.wrap(trace, "set_tracer_provider", self._taking_over)

    def attribution_report(self, spans: Mapping[str, int]) -> str | None:
        """The spans agl_otel saw start in the rollout, none of them an agent span it knows."""
        if not spans:
            return (
                "agl_otel saw no OpenTelemetry span start in it: is the framework's instrumentor on (e.g."
                " `OpenInference's <Framework>Instrumentor().instrument()`), on the tracer provider agl_otel uses?"
            )
        common = ", ".join(f"{name} ({count})" for name, count in Counter(spans).most_common(6))
        return (
            f"agl_otel saw {sum(spans.values())} span(s) start in it, none an agent span of a convention it knows"
            f" (agl_otel.conventions); the most common: {common}."
        )

    def _uninstrument(self) -> None:
        runtime_agents.uninstall()
        if self.processor is not None:
            self.processor.enabled = False

    def _in_place(self) -> bool:
        return self.processor is not None and self.processor.enabled and not runtime_agents.awaited()

    def add_to(self, provider: TracerProvider) -> None:
        """Add agl's processor to `provider` (once, however often asked)."""
        assert self.processor is not None and self._with_processor is not None
        if provider not in self._with_processor:
            provider.add_span_processor(self.processor)
            self._with_processor.add(provider)

    def _taking_over(self, set_provider: Callable[[Any], None]) -> Callable[[Any], None]:
        @functools.wraps(set_provider)
        def wrapper(provider: Any) -> None:
            stand_in = self.stand_in
            if stand_in is None or trace.get_tracer_provider() is not stand_in or provider is stand_in:
                set_provider(provider)
                return
            if isinstance(provider, TracerProvider):
                self.add_to(provider)
            # OpenTelemetry sets its provider once; the one set was agl's stand-in, so the app's takes its place
            trace._TRACER_PROVIDER = provider
            self.stand_in = None
            log.info("the app set its OpenTelemetry tracer provider: agl's processor is on it")

        return wrapper


def instrument(tracer_provider: TracerProvider | None = None) -> None:
    """Attribute each agent's LLM calls to the agent named by its OpenTelemetry span (GenAI `invoke_agent`,
    OpenInference `AGENT`, ...) and record tool spans with their status, inside agl rollouts.

    `tracer_provider`: the SDK provider to add agl's processor to; by default the global one (set first if the
    app has none). Idempotent and cheap. `uninstrument()` undoes it."""
    instrumentor = OTelInstrumentor()
    if tracer_provider is not None:
        instrumentor.requested = tracer_provider
        if instrumentor.is_instrumented():
            instrumentor.add_to(tracer_provider)
            return
    instrumentor.instrument()


def uninstrument() -> None:
    """Stop turning spans into agl scopes and tool spans. Idempotent."""
    OTelInstrumentor().uninstrument()


def is_instrumented() -> bool:
    return OTelInstrumentor().is_instrumented()
