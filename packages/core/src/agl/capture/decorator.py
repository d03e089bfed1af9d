"""`@agl.rollout`: mark a plain function (sync or async) as an agent that agl can run and train.

The function receives the task's input and an `LLM` handle and builds its usual client from the handle. It
may return a float (the final reward), or None and report rewards with `agl.emit_reward` as it goes.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Union, overload

from agl.capture.llm import LLM

RolloutResult = Union[float, int, None]


class RolloutFunction:
    """An agent function wrapped by `@agl.rollout`; calling it still calls the function."""

    def __init__(self, fn: Callable[..., RolloutResult | Awaitable[RolloutResult]], name: str | None = None) -> None:
        params = list(inspect.signature(fn).parameters.values())
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(positional) < 2 and not any(p.kind is p.VAR_POSITIONAL for p in params):
            raise TypeError(
                f"@agl.rollout function {fn.__qualname__} must take (task, llm); it takes {len(positional)} argument(s)"
            )
        self.fn = fn
        self.name = name or fn.__qualname__
        self.is_async = inspect.iscoroutinefunction(fn)
        functools.update_wrapper(self, fn)

    def __call__(self, task: Any, llm: LLM) -> Any:
        return self.fn(task, llm)


@overload
def rollout(fn: Callable[..., Any], *, name: str | None = None) -> RolloutFunction: ...


@overload
def rollout(fn: None = None, *, name: str | None = None) -> Callable[[Callable[..., Any]], RolloutFunction]: ...


def rollout(
    fn: Callable[..., Any] | None = None, *, name: str | None = None
) -> RolloutFunction | Callable[[Callable[..., Any]], RolloutFunction]:
    """Decorator: `@agl.rollout` or `@agl.rollout(name="solver")`."""
    if fn is None:
        return lambda f: RolloutFunction(f, name)
    return RolloutFunction(fn, name)


def as_rollout_function(obj: Any) -> RolloutFunction:
    if isinstance(obj, RolloutFunction):
        return obj
    if callable(obj):
        return RolloutFunction(obj)
    raise TypeError(f"{obj!r} is not a function decorated with @agl.rollout")
