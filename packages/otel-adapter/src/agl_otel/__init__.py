"""agl adapter for any agent framework that emits OpenTelemetry spans in the GenAI semantic conventions or
OpenInference's (Microsoft Agent Framework, Pydantic AI, Google ADK and Strands Agents natively; LangGraph,
LlamaIndex, DSPy, Agno, Haystack, smolagents, CrewAI, BeeAI and the OpenAI Agents SDK through
openinference-instrumentation-*; or your own spans).

`agl_otel.instrument()` adds agl's span processor to the app's tracer provider: during an agl rollout each LLM
call is stored under the agent whose span it runs in (`invoke_agent` with `gen_ai.agent.name`, OpenInference
kind `AGENT`; the innermost when agents nest), and every tool span (`execute_tool`, kind `TOOL`) becomes an agl
tool span with status ok / error, so agent selection and AIR's tool rules work unchanged. The conventions are
one table (`agl_otel.conventions.CONVENTIONS`). Importing this package changes nothing; `uninstrument()` undoes
`instrument()`.
"""

from __future__ import annotations

from agl_otel.conventions import CONVENTIONS, Convention, match
from agl_otel.instrumentation import OTelInstrumentor, instrument, is_instrumented, uninstrument
from agl_otel.processor import AglSpanProcessor

__version__ = "0.1.0"

__all__ = [
    "CONVENTIONS",
    "AglSpanProcessor",
    "Convention",
    "OTelInstrumentor",
    "__version__",
    "instrument",
    "is_instrumented",
    "match",
    "uninstrument",
]
