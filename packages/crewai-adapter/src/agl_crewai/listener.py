"""`AglListener`: agl's CrewAI event-bus listener, and `instrument()` / `uninstrument()` around it."""

from __future__ import annotations

import logging
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

from agl.capture.instrumentation import Instrumentor
from agl_crewai import agent_scopes, tool_spans


class AglListener(BaseEventListener):
    """Records every CrewAI tool execution as an agl tool span (ok / error) and makes each agent's role the agl
    agent of the LLM calls it makes, so `AGL_TRAIN_AGENTS=<role>,...` picks whose calls are trained.

    Create it once, as any CrewAI listener (`AglListener()`), or call `agl_crewai.instrument()`: both run
    `CrewAIInstrumentor`. There is only ever one: creating it again returns the one already listening.
    `remove()` undoes everything. Outside an agl rollout it records nothing, so the crew runs as before.
    """

    _handlers: list[tuple[type[Any], Callable[..., None]]]

    def __new__(cls) -> AglListener:
        return instrument()

    def __init__(self) -> None:
        """Registered by `CrewAIInstrumentor` (see `_listen`); called again by each `AglListener()`: nothing to do."""

    @classmethod
    def _listen(cls) -> AglListener:
        listener: AglListener = object.__new__(cls)
        listener._handlers = []
        BaseEventListener.__init__(listener)  # registers the handlers (`setup_listeners`)
        return listener

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

    def _stop(self) -> None:
        for event_type, handler in self._handlers:
            crewai_event_bus.off(event_type, handler)
        self._handlers = []

    @property
    def listening(self) -> bool:
        return CrewAIInstrumentor().listener is self and bool(self._handlers)

    def remove(self) -> None:
        """Unregister the handlers and restore CrewAI's agent methods. Idempotent."""
        if CrewAIInstrumentor().listener is self:
            uninstrument()


class CrewAIInstrumentor(Instrumentor):
    """The event-bus listener, and `crewai.Agent`'s entry points wrapped in agent scopes: the bus cannot name
    the agent where its LLM requests are sent (see `agent_scopes`)."""

    dependencies: ClassVar[dict[str, str]] = {"crewai": "'crewai>=1.15.30,<2'"}
    names_agents = True  # the worker warns when a rollout's calls got no agent name from it
    listener: AglListener | None = None

    def _instrument(self) -> None:
        self.listener = AglListener._listen()
        agent_scopes.wrap_agent_methods(self)
        logging.getLogger(_BASE_LLM_LOGGER).addFilter(_APPROXIMATE_COUNT)

    def _uninstrument(self) -> None:
        if self.listener is not None:
            self.listener._stop()
            self.listener = None
        logging.getLogger(_BASE_LLM_LOGGER).removeFilter(_APPROXIMATE_COUNT)


class _NoApproximateCountWarning(logging.Filter):
    """CrewAI estimates input tokens at one per four characters on any OpenAI-compatible server, agl's included,
    and warns at each estimate; under agl the policy's own token ids are recorded with every call, so the estimate
    costs nothing worth a warning per call."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Using an approximate input token count")


_BASE_LLM_LOGGER = "crewai.llms.base_llm"
_APPROXIMATE_COUNT = _NoApproximateCountWarning()


def instrument() -> AglListener:
    """Attribute each CrewAI agent's LLM calls to its role and record its tools as agl spans. Idempotent; returns
    the active listener."""
    instrumentor = CrewAIInstrumentor()
    instrumentor.instrument()
    listener = instrumentor.listener
    if listener is None:  # only if another thread uninstrumented in between
        raise RuntimeError("agl_crewai was uninstrumented while instrument() ran")
    return listener


def uninstrument() -> None:
    """Undo `instrument()` (or a directly created `AglListener`). Idempotent."""
    CrewAIInstrumentor().uninstrument()


def is_instrumented() -> bool:
    return CrewAIInstrumentor().is_instrumented()
