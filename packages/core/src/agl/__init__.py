"""agl: train the LLM inside any agent with reinforcement learning.

The public names below are loaded on first use, so `import agl` stays light (no server, HTTP or OpenTelemetry
code is imported until something needs it).

agl-core is laid out by the three stages of its data flow, each a folder, over what they share:

- `agl.capture`: the agent's side (the decorator, the runner, agent loading, the instrumentation base, tracing,
  the LLM handle);
- `agl.store` and `agl.server`: keeping what was captured (the durable store; `agl serve`: REST API, OTLP
  receiver, LLM proxy, dashboard);
- `agl.learn`: stored rollouts into transitions and credit (agent selection, AIR, transitions, credit);
- below them, `agl.schema` (the public records), `agl.protocol` (the names on the wire), `agl.client` (the REST
  client capture and learn both use) and `agl.common` (shared records, wire formats and utilities);
- above them, `agl.cli` and `agl.testing`, which use every stage.

No module imports a stage above its own (common < capture < store < server < learn < cli, testing):
`tests/test_layout.py` checks it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from agl._version import __version__

_EXPORTS = {
    "rollout": "agl.capture.decorator",
    "LLM": "agl.capture.llm",
    "RolloutFunction": "agl.capture.decorator",
    "emit_reward": "agl.capture.tracing.spans",
    "agent": "agl.capture.tracing.spans",
    "span": "agl.capture.tracing.spans",
    "tool": "agl.capture.tracing.spans",
    "record_span": "agl.capture.tracing.spans",
    "record_tool": "agl.capture.tracing.spans",
    "enter_agent": "agl.capture.tracing.context",
    "exit_agent": "agl.capture.tracing.context",
    "current_rollout": "agl.capture.tracing.context",
    "current_agent": "agl.capture.tracing.context",
    "propagate": "agl.capture.tracing.context",
    "external_llm": "agl.capture.tracing.context",
    "allow_external_llm": "agl.capture.tracing.context",
    "attribution_headers": "agl.capture.tracing.http_inject",
    "Client": "agl.client",
    "AsyncClient": "agl.client",
    "Runner": "agl.capture.runner",
    "RunnerOptions": "agl.capture.runner",
    "Store": "agl.store",
    "configure_otel": "agl.capture.tracing.otel",
    "run_cli": "agl.capture.cli_agent",
    "workspace": "agl.capture.cli_agent",
    "CliResult": "agl.capture.cli_agent",
    "agent_home": "agl.capture.cli_agent",
    "Sandbox": "agl.capture.sandbox.policy",
    "Limits": "agl.capture.sandbox.policy",
    "SandboxUnavailable": "agl.capture.sandbox.launch",
    "run_sandboxed": "agl.capture.sandbox.run",
    "sandboxed": "agl.capture.sandbox.run",
    "SandboxedRun": "agl.capture.sandbox.run",
    "read_agent_file": "agl.capture.sandbox.files",
    "record_tool_runs": "agl.capture.tool_runs",
}

__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:  # the same names, for type checkers (the `as` form marks them as re-exported)
    from agl.capture.cli_agent import CliResult as CliResult
    from agl.capture.cli_agent import agent_home as agent_home
    from agl.capture.cli_agent import run_cli as run_cli
    from agl.capture.cli_agent import workspace as workspace
    from agl.capture.decorator import RolloutFunction as RolloutFunction
    from agl.capture.decorator import rollout as rollout
    from agl.capture.llm import LLM as LLM
    from agl.capture.runner import Runner as Runner
    from agl.capture.runner import RunnerOptions as RunnerOptions
    from agl.capture.sandbox.files import read_agent_file as read_agent_file
    from agl.capture.sandbox.launch import SandboxUnavailable as SandboxUnavailable
    from agl.capture.sandbox.policy import Limits as Limits
    from agl.capture.sandbox.policy import Sandbox as Sandbox
    from agl.capture.sandbox.run import SandboxedRun as SandboxedRun
    from agl.capture.sandbox.run import run_sandboxed as run_sandboxed
    from agl.capture.sandbox.run import sandboxed as sandboxed
    from agl.capture.tool_runs import record_tool_runs as record_tool_runs
    from agl.capture.tracing.context import allow_external_llm as allow_external_llm
    from agl.capture.tracing.context import current_agent as current_agent
    from agl.capture.tracing.context import current_rollout as current_rollout
    from agl.capture.tracing.context import enter_agent as enter_agent
    from agl.capture.tracing.context import exit_agent as exit_agent
    from agl.capture.tracing.context import external_llm as external_llm
    from agl.capture.tracing.context import propagate as propagate
    from agl.capture.tracing.http_inject import attribution_headers as attribution_headers
    from agl.capture.tracing.otel import configure_otel as configure_otel
    from agl.capture.tracing.spans import agent as agent
    from agl.capture.tracing.spans import emit_reward as emit_reward
    from agl.capture.tracing.spans import record_span as record_span
    from agl.capture.tracing.spans import record_tool as record_tool
    from agl.capture.tracing.spans import span as span
    from agl.capture.tracing.spans import tool as tool
    from agl.client import AsyncClient as AsyncClient
    from agl.client import Client as Client
    from agl.store import Store as Store


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
