"""`AglListener`: agl's CrewAI event-bus listener, and `instrument()` / `uninstrument()` around it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, ClassVar

from crewai.events import BaseEventListener
from crewai.events.event_bus import CrewAIEventsBus, crewai_event_bus
from crewai.events.types.tool_usage_events import (
    ToolSelectionErrorEvent,
    ToolUsageErrorEvent,
    ToolUsageFinishedEvent,
    ToolUsageStartedEvent,
    ToolValidateInputErrorEvent,
)

from agl_crewai import agent_scopes, tool_spans

_lock = threading.RLock()


class AglListener(BaseEventListener):
    """Records every CrewAI tool execution as an agl tool span (ok / error) and makes each agent's role the agl
    agent of the LLM calls it makes, so `AGL_TRAIN_AGENTS=<role>,...` picks whose calls are trained.

    Create it once, as any CrewAI listener (`AglListener()`), or call `agl_crewai.instrument()`. There is only
    ever one: creating it again returns the one already listening. `remove()` undoes everything. Outside an agl
    rollout it records nothing, so the crew runs as before.
    """

    _active: ClassVar[AglListener | None] = None
    _handlers: list[tuple[type[Any], Callable[..., None]]]

    def __new__(cls) -> AglListener:
        with _lock:
            if AglListener._active is None:
                listener = super().__new__(cls)
                listener._handlers = []
                AglListener._active = listener
            return AglListener._active

    def __init__(self) -> None:
        with _lock:
            if self._handlers:  # already listening: installing twice is installing once
                return
            super().__init__()  # registers the handlers (`setup_listeners`)
            # The bus cannot name the agent where its LLM requests are sent (see agent_scopes): wrap its methods.
            agent_scopes.install()

    def setup_listeners(self, crewai_event_bus: CrewAIEventsBus) -> None:
        starts = tool_spans.ToolStarts()

        def started(source: Any, event: ToolUsageStartedEvent) -> None:
            tool_spans.on_started(starts, event)

        def finished(source: Any, event: ToolUsageFinishedEvent) -> None:
            tool_spans.on_finished(starts, event)

        def errored(source: Any, event: ToolUsageErrorEvent) -> None:
            tool_spans.on_error(starts, event)

        def rejected(source: Any, event: ToolSelectionErrorEvent | ToolValidateInputErrorEvent) -> None:
            tool_spans.on_rejected(event)

        handlers: list[tuple[type[Any], Callable[..., None]]] = [
            (ToolUsageStartedEvent, started),
            (ToolUsageFinishedEvent, finished),
            (ToolUsageErrorEvent, errored),
            (ToolSelectionErrorEvent, rejected),
            (ToolValidateInputErrorEvent, rejected),
        ]
        for event_type, handler in handlers:
            crewai_event_bus.on(event_type)(handler)
        self._handlers = handlers

    @property
    def listening(self) -> bool:
        return AglListener._active is self and bool(self._handlers)

    def remove(self) -> None:
        """Unregister the handlers and restore CrewAI's agent methods. Idempotent."""
        with _lock:
            for event_type, handler in self._handlers:
                crewai_event_bus.off(event_type, handler)
            self._handlers = []
            if AglListener._active is self:
                AglListener._active = None
                agent_scopes.uninstall()


def instrument() -> AglListener:
    """Attribute each CrewAI agent's LLM calls to its role and record its tools as agl spans. Idempotent; returns
    the active listener."""
    return AglListener()


def uninstrument() -> None:
    """Undo `instrument()` (or a directly created `AglListener`). Idempotent."""
    with _lock:
        if AglListener._active is not None:
            AglListener._active.remove()


def is_instrumented() -> bool:
    return AglListener._active is not None
