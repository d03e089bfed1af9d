"""Turn an agent's tool-call events into agl tool spans with status ok / error.

AgentChat reports every tool call an agent makes as two events in the agent's stream: `ToolCallRequestEvent`
(what the model asked for) and `ToolCallExecutionEvent` (one `FunctionExecutionResult` per call, with
`is_error`). The events are read rather than the tools wrapped because AgentChat catches most failures before
or around the tool itself (arguments that are not JSON, a tool name the model made up, an exception inside a
workbench tool) and turns them into an error result the model sees: those must become `error` spans too, and
only the result event carries all of them, whatever workbench (static, MCP, ...) ran the tool.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import agl
from agl.tracing import attributes as attr
from agl.tracing.context import RolloutContext
from autogen_agentchat.messages import ToolCallExecutionEvent, ToolCallRequestEvent
from autogen_core import FunctionCall
from autogen_core.models import FunctionExecutionResult


@dataclass
class _Requested:
    call: FunctionCall
    seen_at: float


@dataclass
class ToolSpanRecorder:
    """Records each tool result of one agent turn once, as a child span of the turn's agent span.

    The same event may be seen by several layers of one turn (an agent's `on_messages` that drives its own
    `on_messages_stream`, then the final `Response.inner_messages`), so results are recorded once by identity.
    """

    agent_name: str
    rollout: RolloutContext
    parent_span_id: str | None
    _requested: dict[str, _Requested] = field(default_factory=dict)
    _recorded: dict[int, FunctionExecutionResult] = field(default_factory=dict)

    def observe(self, item: Any) -> None:
        if isinstance(item, ToolCallRequestEvent):
            now = time.time()
            for call in item.content:
                self._requested.setdefault(call.id, _Requested(call, now))
        elif isinstance(item, ToolCallExecutionEvent):
            for result in item.content:
                self._record(result)

    def observe_all(self, items: Any) -> None:
        for item in items or ():
            self.observe(item)

    def _record(self, result: FunctionExecutionResult) -> None:
        if id(result) in self._recorded:
            return
        self._recorded[id(result)] = result  # holding it keeps its id from being reused during the turn
        end = time.time()
        # Call ids are optional for some models; without one the start and arguments are unknown.
        requested = self._requested.get(result.call_id) if result.call_id else None
        attributes: dict[str, Any] = {attr.TOOL_NAME: result.name, attr.TOOL_RESULT: result.content}
        if result.call_id:
            attributes[attr.TOOL_CALL_ID] = result.call_id
        if requested is not None:
            attributes[attr.TOOL_ARGUMENTS] = requested.call.arguments
        failed = bool(result.is_error)
        agl.record_span(
            f"tool:{result.name}",
            kind="tool",
            start_time=requested.seen_at if requested is not None else end,
            end_time=end,
            status="error" if failed else "ok",
            status_message=result.content if failed else None,
            attributes=attributes,
            agent_name=self.agent_name,
            parent_id=self.parent_span_id,
            ctx=self.rollout,
        )
