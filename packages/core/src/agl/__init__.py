"""agl: train the LLM inside any agent with reinforcement learning.

The public names below are loaded on first use, so `import agl` stays light (no server, HTTP or OpenTelemetry
code is imported until something needs it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from agl._version import __version__

_EXPORTS = {
    "rollout": "agl.decorator",
    "LLM": "agl.llm",
    "RolloutFunction": "agl.decorator",
    "emit_reward": "agl.tracing.spans",
    "agent": "agl.tracing.spans",
    "span": "agl.tracing.spans",
    "tool": "agl.tracing.spans",
    "record_span": "agl.tracing.spans",
    "record_tool": "agl.tracing.spans",
    "enter_agent": "agl.tracing.context",
    "exit_agent": "agl.tracing.context",
    "current_rollout": "agl.tracing.context",
    "current_agent": "agl.tracing.context",
    "propagate": "agl.tracing.context",
    "external_llm": "agl.tracing.context",
    "allow_external_llm": "agl.tracing.context",
    "attribution_headers": "agl.tracing.http_inject",
    "Client": "agl.client",
    "AsyncClient": "agl.client",
    "Runner": "agl.runner",
    "RunnerOptions": "agl.runner",
    "Store": "agl.store",
    "configure_otel": "agl.tracing.otel",
}

__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:  # the same names, for type checkers (the `as` form marks them as re-exported)
    from agl.client import AsyncClient as AsyncClient
    from agl.client import Client as Client
    from agl.decorator import RolloutFunction as RolloutFunction
    from agl.decorator import rollout as rollout
    from agl.llm import LLM as LLM
    from agl.runner import Runner as Runner
    from agl.runner import RunnerOptions as RunnerOptions
    from agl.store import Store as Store
    from agl.tracing.context import allow_external_llm as allow_external_llm
    from agl.tracing.context import current_agent as current_agent
    from agl.tracing.context import current_rollout as current_rollout
    from agl.tracing.context import enter_agent as enter_agent
    from agl.tracing.context import exit_agent as exit_agent
    from agl.tracing.context import external_llm as external_llm
    from agl.tracing.context import propagate as propagate
    from agl.tracing.http_inject import attribution_headers as attribution_headers
    from agl.tracing.otel import configure_otel as configure_otel
    from agl.tracing.spans import agent as agent
    from agl.tracing.spans import emit_reward as emit_reward
    from agl.tracing.spans import record_span as record_span
    from agl.tracing.spans import record_tool as record_tool
    from agl.tracing.spans import span as span
    from agl.tracing.spans import tool as tool


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
