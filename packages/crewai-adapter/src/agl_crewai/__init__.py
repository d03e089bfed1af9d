"""agl for CrewAI: train the LLM inside a crew with reinforcement learning.

    import agl_crewai
    agl_crewai.instrument()   # or, as any CrewAI listener: agl_crewai.AglListener()

Each agent's LLM calls are attributed to its `role` (and, as a second name selection also matches, its role
before the crew's inputs were filled in) and each tool execution is recorded as a tool span (ok /
error). Importing this package changes nothing; `instrument()` does, and `uninstrument()` undoes it.
"""

from __future__ import annotations

from agl_crewai.agent_scopes import agent_key, agent_name
from agl_crewai.listener import AglListener, CrewAIInstrumentor, instrument, is_instrumented, uninstrument

__version__ = "0.1.0"
__all__ = [
    "AglListener",
    "CrewAIInstrumentor",
    "__version__",
    "agent_key",
    "agent_name",
    "instrument",
    "is_instrumented",
    "uninstrument",
]
