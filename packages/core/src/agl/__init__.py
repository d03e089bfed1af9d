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
    "LLM": "agl.decorator",
    "RolloutFunction": "agl.decorator",
    "emit_reward": "agl.tracing.spans",
    "agent": "agl.tracing.spans",
    "span": "agl.tracing.spans",
    "tool": "agl.tracing.spans",
    "current_rollout": "agl.tracing.context",
    "current_agent": "agl.tracing.context",
    "propagate": "agl.tracing.context",
    "attribution_headers": "agl.tracing.http_inject",
    "Client": "agl.client",
    "AsyncClient": "agl.client",
    "Runner": "agl.runner",
    "RunnerOptions": "agl.runner",
    "Store": "agl.store",
}

__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:
    from agl.client import AsyncClient, Client
    from agl.decorator import LLM, RolloutFunction, rollout
    from agl.runner import Runner, RunnerOptions
    from agl.store import Store
    from agl.tracing.context import current_agent, current_rollout, propagate
    from agl.tracing.http_inject import attribution_headers
    from agl.tracing.spans import agent, emit_reward, span, tool


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
