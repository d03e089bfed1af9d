"""agl adapter for LangChain and LangGraph.

Call `agl_langchain.instrument()` once (every run in the process is then traced), or pass `AglCallbackHandler()`
in a run's callbacks, or bind it once with `with_agl(graph)`: each LLM call is then attributed to the agent that
made it (the LangGraph node, or the `create_agent(name=...)`), and each tool run is recorded as a tool span with
status ok / error. Importing this package patches and registers nothing; `uninstrument()` undoes `instrument()`.
"""

from __future__ import annotations

from agl_langchain.binding import has_agl, with_agl
from agl_langchain.handler import AglCallbackHandler
from agl_langchain.instrumentation import LangChainInstrumentor, instrument, is_instrumented, uninstrument

__version__ = "0.1.0"

__all__ = [
    "AglCallbackHandler",
    "LangChainInstrumentor",
    "__version__",
    "has_agl",
    "instrument",
    "is_instrumented",
    "uninstrument",
    "with_agl",
]
