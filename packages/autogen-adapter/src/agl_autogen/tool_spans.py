"""Turn an agent's tool-call and code-execution events into agl tool spans with status ok / error.

AgentChat reports every tool call an agent makes as two events in the agent's stream: `ToolCallRequestEvent`
(what the model asked for) and `ToolCallExecutionEvent` (one `FunctionExecutionResult` per call, with
`is_error`). The events are read rather than the tools wrapped because AgentChat catches most failures before
or around the tool itself (arguments that are not JSON, a tool name the model made up, an exception inside a
workbench tool) and turns them into an error result the model sees: those must become `error` spans too, and
only the result event carries all of them, whatever workbench (static, MCP, ...) ran the tool.
`CodeExecutorAgent` reports the code it runs the same way (`CodeGenerationEvent`, then `CodeExecutionEvent`
with the exit code): each run becomes a `tool:code_execution` span, `error` when the exit code is not 0.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from autogen_agentchat.messages import (
    CodeExecutionEvent,
    CodeGenerationEvent,
    ToolCallExecutionEvent,
    ToolCallRequestEvent,
)

import agl
from agl.capture.tracing.context import RolloutContext

CODE_EXECUTION = "code_execution"


@dataclass
class ToolSpanRecorder:
    """Records each tool result of one agent turn once, as a child span of the turn's agent span.

    The same event may be seen by several layers of one turn (an agent's `on_messages` that drives its own
    `on_messages_stream`, then the final `Response.inner_messages`), so results are recorded once by identity.
    """

    agent_name: str
    rollout: RolloutContext
    parent_span_id: str | None
    _requests: dict[str, tuple[str, float]] = field(default_factory=dict)  # call id -> (arguments, seen at)
    _code: tuple[str, float] | None = None  # the code last generated, and when
    _recorded: dict[int, object] = field(default_factory=dict)

    def observe(self, item: Any) -> None:
        # An agent may pass on another agent's events (an `AgentTool` streams the inner agent's tool calls
        # into the outer agent's stream): those are the other agent's, recorded in its own turn.
        if getattr(item, "source", None) != self.agent_name:
            return
        if isinstance(item, ToolCallRequestEvent):
            for call in item.content:
                if call.id:  # optional for some models: without one, start and arguments stay unknown
                    self._requests.setdefault(call.id, (call.arguments, time.time()))
        elif isinstance(item, ToolCallExecutionEvent):
            for result in item.content:
                if not self._first_sight(result):
                    continue
                arguments, start = self._requests.get(result.call_id, (None, None))
                error = result.content if result.is_error else None
                self._record(result.name, result.call_id, arguments, result.content, start, error)
        elif isinstance(item, CodeGenerationEvent) and item.code_blocks:
            self._code = ("\n\n".join(block.code for block in item.code_blocks), time.time())
        elif isinstance(item, CodeExecutionEvent) and self._first_sight(item):
            code, start = self._code or (None, None)
            failed = item.result.exit_code != 0
            message = f"exit code {item.result.exit_code}: {item.result.output[-500:]}" if failed else None
            self._record(CODE_EXECUTION, None, code, item.result.output, start, message)

    def observe_all(self, items: Any) -> None:
        for item in items or ():
            self.observe(item)

    def _first_sight(self, obj: object) -> bool:
        if id(obj) in self._recorded:
            return False
        self._recorded[id(obj)] = obj  # holding it keeps its id from being reused during the turn
        return True

    def _record(
        self,
        name: str,
        call_id: str | None,
        arguments: str | None,
        result: str,
        start: float | None,
        error: str | None,
    ) -> None:
        end = time.time()
        agl.record_tool(
            name,
            start_time=start if start is not None else end,
            end_time=end,
            error=error,
            call_id=call_id or None,
            arguments=arguments,
            result=result,
            agent_name=self.agent_name,
            parent_id=self.parent_span_id,
            ctx=self.rollout,
        )
