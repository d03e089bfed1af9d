"""Make a CrewAI agent's role the acting agl agent while that agent works, so its LLM requests carry the role.

Why a wrap and not an event handler: CrewAI's event bus runs synchronous handlers on a thread pool of its own
(with a copy of the emitter's context) and asynchronous ones on a background event loop. A handler can read the
rollout the event came from, but it cannot set the current agent in the thread or task that goes on to send the
LLM request. So the agent's own entry points are wrapped, at class level, with an `agl.agent(role)` scope: the
scope is then set exactly where the agent's executor runs. CrewAI copies the context into every thread it starts
for an agent (tasks with `async_execution`, `max_execution_time`, streaming crews, `kickoff_async`) and asyncio
tasks inherit it, so the name follows the agent's requests there too. A delegated task runs the coworker's own
`execute_task` inside the manager's scope: the innermost scope wins, so each call carries the agent that made it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from crewai import Agent
from crewai.events.event_bus import crewai_event_bus

import agl
from agl.capture.instrumentation import Instrumentor

# Sync and async entry points of an agent's work. `akickoff` calls `kickoff_async`, and `kickoff` hands over
# to `kickoff_async` when called inside an event loop, so wrapping these four covers every path once.
SYNC_METHODS = ("execute_task", "kickoff")
ASYNC_METHODS = ("aexecute_task", "kickoff_async")

# How long the end of an agent's work waits for CrewAI's handler threads to record its tool events.
EVENT_FLUSH_TIMEOUT_S = 10.0
_BUS_THREAD_PREFIX = "CrewAISyncHandler"  # the name CrewAI gives its handler threads

log = logging.getLogger(__name__)
_warned_roles: set[str] = set()
_SCOPED = "__agl_crewai_scope__"  # marks agl's wrappers


def agent_name(agent: Any) -> str | None:
    """The name an agent's calls are attributed to: its `role` (see `name_of_role`)."""
    return name_of_role(getattr(agent, "role", None))


def agent_key(agent: Any) -> str | None:
    """The agent's stable second name: its role before CrewAI filled in the crew's inputs (`{topic} Senior Data
    Researcher`), when that differs from the role. The role itself changes with every `kickoff(inputs=...)`; the
    template does not, so `AGL_TRAIN_AGENTS="{topic} Senior Data Researcher"` selects the agent in every run."""
    original = name_of_role(getattr(agent, "_original_role", None))
    return original if original is not None and original != agent_name(agent) else None


def name_of_role(role: Any) -> str | None:
    """A role with whitespace runs collapsed to one space; None for no role or one that cannot be sent.

    Roles written as YAML folded scalars (CrewAI's project template) end with a newline, which cannot travel in
    an HTTP header and which `AGL_TRAIN_AGENTS` could never match; nothing else about the role is changed. The
    name travels to agl's proxy in an HTTP header, which agl-core sends as ASCII: a role with other characters
    would make every LLM request of the agent fail, so its calls are left unattributed (and a warning says so).
    """
    if not isinstance(role, str):
        return None
    name = " ".join(role.split())
    if not name:
        return None
    if not (name.isascii() and name.isprintable()):
        if name not in _warned_roles:
            _warned_roles.add(name)
            log.warning("agl: CrewAI role %r is not plain ASCII; its LLM calls are stored unattributed", name)
        return None
    return name


def _wait_for_tool_events() -> None:
    # Tool events are handled on CrewAI's thread pool, a little after they happen. The runner reports the attempt
    # as soon as the rollout function returns, so the agent's step is not over for agl until its tool spans are
    # recorded. Only inside a rollout: outside one nothing is recorded and nothing needs waiting for.
    if agl.current_rollout() is None:
        return
    if threading.current_thread().name.startswith(_BUS_THREAD_PREFIX):
        return  # an agent run from inside an event handler: waiting for all handlers would wait for itself
    crewai_event_bus.flush(timeout=EVENT_FLUSH_TIMEOUT_S)


def _scoped_sync(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def run_as_agent(self: Any, *args: Any, **kwargs: Any) -> Any:
        name = agent_name(self)
        if name is None:  # nothing to name it by: its calls are stored as unattributed, never guessed
            return original(self, *args, **kwargs)
        with agl.agent(name, key=agent_key(self)):
            try:
                return original(self, *args, **kwargs)
            finally:
                _wait_for_tool_events()

    setattr(run_as_agent, _SCOPED, True)
    return run_as_agent


def _scoped_async(original: Callable[..., Coroutine[Any, Any, Any]]) -> Callable[..., Coroutine[Any, Any, Any]]:
    @functools.wraps(original)
    async def run_as_agent(self: Any, *args: Any, **kwargs: Any) -> Any:
        name = agent_name(self)
        if name is None:
            return await original(self, *args, **kwargs)
        with agl.agent(name, key=agent_key(self)):
            try:
                return await original(self, *args, **kwargs)
            finally:
                if agl.current_rollout() is not None:  # wait off the event loop: other agents keep running
                    await asyncio.to_thread(_wait_for_tool_events)

    setattr(run_as_agent, _SCOPED, True)
    return run_as_agent


def wrap_agent_methods(instrumentor: Instrumentor) -> None:
    """Wrap `crewai.Agent`'s entry points in agent scopes, through `instrumentor` (which undoes it)."""
    for name in SYNC_METHODS:
        instrumentor.wrap(Agent, name, _scoped_sync)
    for name in ASYNC_METHODS:
        instrumentor.wrap(Agent, name, _scoped_async)


def installed() -> bool:
    """Whether `crewai.Agent`'s entry points are agl's scoped wrappers now."""
    return any(getattr(getattr(Agent, name), _SCOPED, False) for name in (*SYNC_METHODS, *ASYNC_METHODS))
