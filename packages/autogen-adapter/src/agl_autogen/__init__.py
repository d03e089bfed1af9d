"""agl adapter for AutoGen AgentChat.

    import agl_autogen
    agl_autogen.instrument()    # once, before or after building agents and teams

Inside an agl rollout, every turn of an AgentChat agent then runs as the agl agent scope named by the agent's
`name` (its LLM calls are stored and selected for training under that name), every tool call becomes a tool
span with status ok / error, and a group chat manager's own LLM calls (SelectorGroupChat's speaker selection)
carry the manager's name. Outside a rollout the hooks do nothing. Importing this package patches nothing.
"""

from __future__ import annotations

from agl_autogen.instrumentation import AutoGenInstrumentor, instrument, is_instrumented, uninstrument

__all__ = ["AutoGenInstrumentor", "instrument", "is_instrumented", "uninstrument"]
__version__ = "0.1.0"
