"""`AglCallbackHandler`: the LangChain callback handler through which agl sees a LangChain or LangGraph run.

Attribution. The proxy learns who sent an LLM request from `agl.current_agent()`, read in the thread or asyncio
task that sends it, at the moment it is sent. A handler with `run_inline = True` has its start callbacks called in
the caller's own context (sync: the same thread; async: awaited in the same task, never in an executor), and
LangChain and LangGraph run what comes next (a node's function, a model's HTTP request) in copies of that context
taken after the start callback. So the agent entered in `on_chain_start` / `on_chat_model_start` names every
request made inside the run, and nodes that LangGraph runs at the same time, in threads or tasks, each keep
their own name.

End callbacks of async runs come from a separate task (LangChain shields them from cancellation), where nothing
done to the caller's context can be undone. Hence: the outermost run changes no context at all (runs find their
parents through `_runs`, not through context variables), and runs inside it change only contexts that LangGraph
or LangChain made for them, which end with them. Each model call sets its agent again, so a name left behind in
a context never reaches a model call.

Tools. `on_tool_start` / `on_tool_end` / `on_tool_error` give one tool span each; a tool that handled its own
error (`ToolMessage(status="error")`) and a ToolNode that answered a call without running a tool (an unknown tool
name) are recorded as errors too.

Run state lives in this module, not in the handler object, so two handlers on the same run act as one.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any, TypeVar
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import LLMResult

from agl.capture.tracing.context import RolloutContext, current_agent, current_rollout, enter_agent, exit_agent
from agl.capture.tracing.spans import record_span, record_tool
from agl.schema import SpanStatus
from agl_langchain.naming import agent_name_of, is_node_run, is_unnamed_agent
from agl_langchain.tool_messages import answered_call_ids, text_of, tool_messages

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class _Scope:
    """Shared by the outermost run the handler sees and every run inside it."""

    root_name: str  # the agent of model calls that no graph node or named agent claims
    recorded_calls: set[str] = field(default_factory=set)  # tool call ids that already have a tool span
    # tool call id -> the agent whose model call asked for it: a shared ToolNode runs tools for several agents
    requested_by: dict[str, str] = field(default_factory=dict)

    def tool_agent(self, call_id: str | None, runner: str | None) -> str | None:
        return self.requested_by.get(call_id, runner) if call_id else runner


@dataclass
class _Tool:
    name: str
    call_id: str | None
    arguments: str | None
    agent: str | None


@dataclass
class _Run:
    ctx: RolloutContext
    scope: _Scope
    start_time: float = field(default_factory=time.time)
    undo: list[Callable[[], None]] = field(default_factory=list)  # context changes to revert at the end, in order
    agent: str | None = None  # the agent this run acts for
    agent_span: bool = False  # this run began the agent's step: it records an `agent:<name>` span
    answered: set[str] | None = None  # LangGraph node runs: tool calls already answered in the node's input
    tool: _Tool | None = None

    def set(self, var: ContextVar[T], value: T) -> None:
        token = var.set(value)
        self.undo.insert(0, lambda: _reset(var, token))

    def enter(self, agent: str) -> None:
        token = enter_agent(agent)
        self.undo.insert(0, lambda: exit_agent(token))
        self.set(_adapter_agent, agent)


def _reset(var: ContextVar[T], token: Token[T]) -> None:
    try:
        var.reset(token)
    except ValueError:  # the end was reported from another task: that context's value dies with it (module doc)
        pass


_runs: dict[UUID, _Run] = {}  # open runs by id; plain dict operations, atomic under the GIL
# The agent name this adapter last made current in this context: tells it apart from a user's `agl.agent` scope.
_adapter_agent: ContextVar[str | None] = ContextVar("agl_langchain_agent", default=None)


def _run_name(serialized: dict[str, Any] | None, kwargs: dict[str, Any]) -> str:
    name = kwargs.get("name") or (serialized or {}).get("name")
    if not name and (ids := (serialized or {}).get("id")):
        name = ids[-1]
    return str(name or "langchain")


def _error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def _is_control_flow(error: BaseException) -> bool:
    """LangGraph raises these to interrupt a run or hand it to another graph, not because a node failed."""
    from langgraph.errors import GraphBubbleUp

    return isinstance(error, GraphBubbleUp)


_warned_rollouts: set[str] = set()


def _warn_unnamed_once(rollout_id: str) -> None:
    """Once per rollout: an agent without a name gives its calls the generic name "model", which no selection can
    tell apart from other unnamed agents (the trainer counts such calls in its step line)."""
    if rollout_id in _warned_rollouts:
        return
    if len(_warned_rollouts) > 10_000:  # a long-lived worker: forget old rollouts rather than grow without end
        _warned_rollouts.clear()
    _warned_rollouts.add(rollout_id)
    log.warning(
        "rollout %s: a LangChain agent made without a name stores its LLM calls as 'model'; give each agent a name "
        "(create_agent(..., name='writer')) to tell agents apart and select them for training",
        rollout_id,
    )


def _open_run(
    run_id: UUID, parent_run_id: UUID | None, run_name: str, metadata: dict[str, Any] | None
) -> tuple[_Run, _Run | None] | None:
    """State for a run that starts inside a rollout, and its parent's (None for the outermost run); None outside
    any rollout, or when another handler has already opened the run."""
    ctx = current_rollout()
    if ctx is None or run_id in _runs:
        return None
    parent = _runs.get(parent_run_id) if parent_run_id is not None else None
    run = _Run(ctx, parent.scope if parent is not None else _Scope(root_name=run_name))
    run.agent = agent_name_of(metadata) or (parent.agent if parent is not None else current_agent())
    _runs[run_id] = run
    return run, parent


class AglCallbackHandler(BaseCallbackHandler):
    """Attributes each LLM call of a LangChain / LangGraph run to its agent and records tool spans for agl.

    Pass it with the run's config: `graph.invoke(state, config={"callbacks": [AglCallbackHandler()]})` (or use
    `agl_langchain.with_agl(graph)`). The agent of a call is the `create_agent(name=...)` it runs in, else the
    LangGraph node, else the name of the outermost run (`run_name`) unless an `agl.agent(...)` scope is open.
    Outside a rollout it does nothing.
    """

    # Start callbacks must run in the caller's context: in an executor, the agent they enter would be lost.
    run_inline = True

    def on_chain_start(
        self,
        serialized: dict[str, Any],
        inputs: dict[str, Any],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        name = _run_name(serialized, kwargs)
        if (opened := _open_run(run_id, parent_run_id, name, metadata)) is None:
            return
        run, parent = opened
        # A chain naming another agent than its parent's begins that agent's step (a graph node, a named agent).
        run.agent_span = run.agent != (parent.agent if parent is not None else current_agent())
        # Inside the outermost run only (see the module doc); a node's own run makes raw OpenAI-client calls in
        # the node carry its name too.
        if parent is not None and run.agent is not None and run.agent != current_agent():
            run.enter(run.agent)
        if is_node_run(metadata, name):
            run.answered = answered_call_ids(inputs)

    def on_chain_end(self, outputs: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        run = _runs.pop(run_id, None)
        if run is not None:
            if run.answered is not None:
                _record_unrun_tool_errors(run, outputs)
            _close(run, None)

    def on_chain_error(
        self, error: BaseException, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        run = _runs.pop(run_id, None)
        if run is not None:
            _close(run, None if _is_control_flow(error) else _error_text(error))

    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._model_start(run_id, parent_run_id, metadata, _run_name(serialized, kwargs))

    def on_llm_start(
        self,
        serialized: dict[str, Any],
        prompts: list[str],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._model_start(run_id, parent_run_id, metadata, _run_name(serialized, kwargs))

    def _model_start(
        self, run_id: UUID, parent_run_id: UUID | None, metadata: dict[str, Any] | None, name: str
    ) -> None:
        if (opened := _open_run(run_id, parent_run_id, name, metadata)) is None:
            return
        run, _ = opened
        if is_unnamed_agent(metadata):
            _warn_unnamed_once(run.ctx.rollout_id)
        agent, current = agent_name_of(metadata), current_agent()
        # No node or named agent: the outermost run's name, unless the code around the call chose the agent
        # (a name this adapter left behind in the context is no choice: it gives way).
        if agent is None and (current is None or current == _adapter_agent.get()):
            agent = run.scope.root_name
        # Set even for the outermost run: the request leaves from a copy of this very context. (An async model
        # call awaited on its own therefore leaves its name in the caller's task: see the README.)
        run.agent = agent
        if agent is not None and agent != current:
            run.enter(agent)

    def on_llm_end(
        self,
        response: LLMResult,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        if (run := _runs.pop(run_id, None)) is None:
            return
        if run.agent is not None:
            for generation in (g for gs in response.generations for g in gs):
                message = getattr(generation, "message", None)
                for call in message.tool_calls if isinstance(message, AIMessage) else []:
                    if call.get("id"):
                        run.scope.requested_by[str(call["id"])] = run.agent
        _close(run, None)

    def on_llm_error(
        self,
        error: BaseException,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        if (run := _runs.pop(run_id, None)) is not None:
            _close(run, None)

    def on_tool_start(
        self,
        serialized: dict[str, Any],
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        inputs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        name = _run_name(serialized, kwargs)
        if (opened := _open_run(run_id, parent_run_id, name, metadata)) is None:
            return
        run, _ = opened
        call_id = kwargs.get("tool_call_id")
        arguments = json.dumps(inputs, default=str) if inputs is not None else input_str
        run.tool = _Tool(name, call_id, arguments, run.scope.tool_agent(call_id, run.agent))
        if call_id:
            run.scope.recorded_calls.add(call_id)

    def on_tool_end(self, output: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        run = _runs.pop(run_id, None)
        if run is None or run.tool is None:
            return
        # A tool that handles its own error (`handle_tool_error`, `handle_validation_error`) still ends "normally".
        if isinstance(output, ToolMessage):
            text = text_of(output)
            _record_tool(run, run.tool, error=text if output.status == "error" else None, result=text)
        else:
            _record_tool(run, run.tool, error=None, result=output)
        _close(run, None)

    def on_tool_error(
        self, error: BaseException, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        run = _runs.pop(run_id, None)
        if run is None or run.tool is None:
            return
        _record_tool(run, run.tool, error=_error_text(error), result=None)
        _close(run, None)


def _record_tool(run: _Run, tool: _Tool, *, error: str | None, result: Any) -> None:
    record_tool(
        tool.name,
        start_time=run.start_time,
        error=error,
        call_id=tool.call_id,
        arguments=tool.arguments,
        result=result,
        agent_name=tool.agent,
        ctx=run.ctx,
    )


def _record_unrun_tool_errors(node: _Run, outputs: Any) -> None:
    """Error answers a node gave to tool calls that no tool run covered (see `tool_messages`)."""
    assert node.answered is not None
    for message in tool_messages(outputs):
        call_id = message.tool_call_id
        if message.status != "error" or call_id in node.answered or call_id in node.scope.recorded_calls:
            continue
        node.scope.recorded_calls.add(call_id)
        tool = _Tool(message.name or "unknown", call_id, None, node.scope.tool_agent(call_id, node.agent))
        _record_tool(node, tool, error=text_of(message), result=None)


def _close(run: _Run, error: str | None) -> None:
    if run.agent_span and run.agent is not None:
        record_span(
            f"agent:{run.agent}",
            kind="agent",
            start_time=run.start_time,
            status=SpanStatus.error if error is not None else SpanStatus.ok,
            status_message=error,
            agent_name=run.agent,
            ctx=run.ctx,
        )
    for undo in run.undo:
        undo()
