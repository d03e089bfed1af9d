"""Await something with every one of its steps run inside a given `contextvars.Context`.

An agent's turn gets a context of its own in which the agl agent scope is open, much as an asyncio task gets
its own: the agent's code (and every task it starts, which copies the context) sees its name, while the code
that drives the turn (a team's container forwarding each streamed event) does not. An asyncio task is not
used for this because it would change cancellation and `current_task()` for the agent's code; stepping the
awaitable by hand keeps it running in the caller's task, only under another context.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Generator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class InContext(Generic[T]):
    """`await InContext(context, awaitable)`: the result of `awaitable`, each step of it run in `context`."""

    __slots__ = ("_awaitable", "_context")

    def __init__(self, context: contextvars.Context, awaitable: Awaitable[T]) -> None:
        self._context = context
        self._awaitable = awaitable

    def __await__(self) -> Generator[Any, Any, T]:
        steps = self._awaitable.__await__()
        run = self._context.run
        to_send: Any = None
        to_throw: BaseException | None = None
        while True:
            try:
                # Whatever the step yields (a future, or None for a bare yield) goes to the task unchanged,
                # so the event loop schedules it exactly as if it had been awaited directly.
                yielded = run(steps.send, to_send) if to_throw is None else run(steps.throw, to_throw)
            except StopIteration as done:
                result: T = done.value
                return result
            to_send, to_throw = None, None
            try:
                to_send = yield yielded
            except GeneratorExit:
                run(steps.close)
                raise
            except BaseException as exc:  # cancellation, or an error the task throws in: the awaitable decides
                to_throw = exc
