"""One agent's turn as an agl agent scope: the wrappers put around AgentChat's `on_messages(_stream)`.

Every way an AgentChat agent is made to act ends in `on_messages` or `on_messages_stream`: `agent.run(...)`,
`agent.run_stream(...)`, a team's participant container, `AgentTool`, `SocietyOfMindAgent`. Each turn gets a
`contextvars.Context` of its own in which `agl.agent(<agent.name>)` is open, and the agent's code runs there
(see `in_context`): the OpenAI client reads the name from it when it sends each request, however the agent
got there (its own task, a task the team runtime made, a task the agent itself started to run tools or read a
stream). The code that consumes the stream runs outside it, so a team never sees one agent's name while it
routes messages to the next.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import AbstractContextManager
from typing import TypeVar

from autogen_agentchat.agents import BaseChatAgent
from autogen_agentchat.base import Response
from autogen_agentchat.messages import BaseAgentEvent, BaseChatMessage
from autogen_core import CancellationToken

import agl
from agl.capture.tracing.context import RolloutContext
from agl.capture.tracing.spans import SpanHandle
from agl_autogen.in_context import InContext
from agl_autogen.tool_spans import ToolSpanRecorder

T = TypeVar("T")
OnMessages = Callable[[BaseChatAgent, Sequence[BaseChatMessage], CancellationToken], Awaitable[Response]]
StreamItem = BaseAgentEvent | BaseChatMessage | Response
OnMessagesStream = Callable[
    [BaseChatAgent, Sequence[BaseChatMessage], CancellationToken], AsyncGenerator[StreamItem, None]
]

ORIGINAL = "__agl_autogen_original__"


class AgentTurn:
    """The agl agent scope of one `on_messages(_stream)` call, open in a context of the turn's own."""

    def __init__(self, agent: BaseChatAgent, rollout: RolloutContext) -> None:
        self.agent = agent
        self.context = contextvars.copy_context()
        self._scope: AbstractContextManager[SpanHandle] = agl.agent(agent.name)
        handle = self.context.run(self._open)
        self.tools = ToolSpanRecorder(agent.name, rollout, parent_span_id=handle.span_id)

    def _open(self) -> SpanHandle:
        _current_turn.set(self)
        return self._scope.__enter__()

    async def run(self, awaitable: Awaitable[T]) -> T:
        return await InContext(self.context, awaitable)

    def close(self, error: BaseException | None = None) -> None:
        """End the agent span: `error` marks it failed (a consumer that stops reading early is no failure)."""
        if isinstance(error, GeneratorExit):
            error = None
        exc_info = (type(error), error, error.__traceback__) if error is not None else (None, None, None)
        self.context.run(self._scope.__exit__, *exc_info)


_current_turn: contextvars.ContextVar[AgentTurn | None] = contextvars.ContextVar("agl_autogen_turn", default=None)


def _turn_in_progress(agent: BaseChatAgent) -> AgentTurn | None:
    """This agent's own turn when the call comes from inside it (`on_messages` driving `on_messages_stream`,
    a subclass calling `super()`): that call belongs to the open scope instead of opening another."""
    turn = _current_turn.get()
    return turn if turn is not None and turn.agent is agent else None


def wrap_on_messages(original: OnMessages) -> OnMessages:
    @functools.wraps(original)
    async def on_messages(
        self: BaseChatAgent, messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken
    ) -> Response:
        rollout = agl.current_rollout()
        inner = _turn_in_progress(self)
        if rollout is None or inner is not None:  # nobody trains, or already inside this agent's scope
            response = await original(self, messages, cancellation_token)
            if inner is not None:
                inner.tools.observe_all(response.inner_messages)
            return response
        turn = AgentTurn(self, rollout)
        try:
            response = await turn.run(original(self, messages, cancellation_token))
            turn.tools.observe_all(response.inner_messages)  # agents that implement only `on_messages`
        except BaseException as exc:
            turn.close(exc)
            raise
        turn.close()
        return response

    setattr(on_messages, ORIGINAL, original)
    return on_messages


def wrap_on_messages_stream(original: OnMessagesStream) -> OnMessagesStream:
    @functools.wraps(original)
    async def on_messages_stream(
        self: BaseChatAgent, messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken
    ) -> AsyncGenerator[StreamItem, None]:
        rollout = agl.current_rollout()
        inner = _turn_in_progress(self)
        if rollout is None or inner is not None:
            async for item in original(self, messages, cancellation_token):
                if inner is not None:
                    inner.tools.observe(item)
                yield item
            return
        turn = AgentTurn(self, rollout)
        stream = original(self, messages, cancellation_token)
        error: BaseException | None = None
        try:
            while True:
                try:
                    item = await turn.run(stream.__anext__())
                except StopAsyncIteration:
                    break
                turn.tools.observe(item)
                if isinstance(item, Response):
                    turn.tools.observe_all(item.inner_messages)
                yield item  # outside the turn's context: the consumer acts under its own name
        except BaseException as exc:
            error = exc
            raise
        finally:
            try:
                await turn.run(stream.aclose())  # an early stop still lets the agent clean up in its scope
            finally:
                turn.close(error)

    setattr(on_messages_stream, ORIGINAL, original)
    return on_messages_stream
