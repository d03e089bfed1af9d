"""agl adapter for the OpenAI Agents SDK.

`agl_openai_agents.instrument()` adds agl's `TracingProcessor` to the SDK's trace pipeline: during an agl
rollout each `Agent`'s LLM calls are attributed to its `Agent.name` (handoffs included), every function tool
call becomes a tool span with status ok / error (with the exception that failed it, which the SDK's own spans
redact since openai-agents 0.21), and nothing is exported to OpenAI's tracing backend.
Importing this package changes nothing; `uninstrument()` undoes `instrument()`.
"""

from __future__ import annotations

from agl_openai_agents.instrumentation import (
    OpenAIAgentsInstrumentor,
    OutsideRollouts,
    instrument,
    is_instrumented,
    uninstrument,
)
from agl_openai_agents.processor import AglTracingProcessor

__version__ = "0.1.0"

__all__ = [
    "AglTracingProcessor",
    "OpenAIAgentsInstrumentor",
    "OutsideRollouts",
    "__version__",
    "instrument",
    "is_instrumented",
    "uninstrument",
]
