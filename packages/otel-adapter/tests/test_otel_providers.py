"""Whose tracer provider agl's processor goes on: the app's when it has one (never replaced, its exporters kept),
agl's own when it has none, and the app's again when it sets one later. Each case in a fresh interpreter:
OpenTelemetry lets a process set its global provider once."""

from __future__ import annotations

import subprocess
import sys

PRELUDE = """
import logging
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
import agl_otel

warnings = []
class Keep(logging.Handler):
    def emit(self, record):
        warnings.append(record.getMessage())
logging.getLogger("opentelemetry").addHandler(Keep())

def app_provider():
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    return tp, exporter

def processors(tp):
    return tp._active_span_processor._span_processors
"""


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", PRELUDE + code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


def test_importing_the_package_sets_nothing() -> None:
    out = _run("print(type(trace.get_tracer_provider()).__name__, agl_otel.is_instrumented())")
    assert out == "ProxyTracerProvider False"


def test_the_apps_provider_is_kept_and_gets_the_processor() -> None:
    out = _run(
        """
tp, exporter = app_provider()
trace.set_tracer_provider(tp)
agl_otel.instrument()
agl_otel.instrument()
assert trace.get_tracer_provider() is tp
names = [type(p).__name__ for p in processors(tp)]
with trace.get_tracer("x").start_as_current_span("invoke_agent a", attributes={"gen_ai.operation.name": "invoke_agent"}):
    pass
print(names, [s.name for s in exporter.get_finished_spans()], warnings)
"""
    )
    assert out == "['SimpleSpanProcessor', 'AglSpanProcessor'] ['invoke_agent a'] []"


def test_without_a_provider_agl_sets_one_and_the_app_may_still_set_its_own() -> None:
    out = _run(
        """
agl_otel.instrument()
stand_in = trace.get_tracer_provider()
assert isinstance(stand_in, TracerProvider)
assert [type(p).__name__ for p in processors(stand_in)] == ["AglSpanProcessor"]
tp, exporter = app_provider()
trace.set_tracer_provider(tp)  # OpenTelemetry would refuse a second provider: agl's stand-in steps aside
assert trace.get_tracer_provider() is tp
with trace.get_tracer("late").start_as_current_span("after"):
    pass
print([type(p).__name__ for p in processors(tp)], [s.name for s in exporter.get_finished_spans()], warnings)
agl_otel.uninstrument()
other, _ = app_provider()
trace.set_tracer_provider(other)  # once agl is out of the way OpenTelemetry's own rule applies again
print(trace.get_tracer_provider() is tp, len(warnings))
"""
    )
    assert out.splitlines() == ["['SimpleSpanProcessor', 'AglSpanProcessor'] ['after'] []", "True 1"]
