"""`with_agl(graph)`: a copy of a runnable that passes `AglCallbackHandler` to every run it starts."""

from __future__ import annotations

from typing import Any, TypeVar

from langchain_core.runnables import Runnable

from agl_langchain.handler import AglCallbackHandler

R = TypeVar("R", bound=Runnable[Any, Any])


def has_agl(runnable: Runnable[Any, Any]) -> bool:
    """True when `runnable` already carries an `AglCallbackHandler` in its bound config."""
    callbacks = (getattr(runnable, "config", None) or {}).get("callbacks")
    handlers = callbacks if isinstance(callbacks, list) else getattr(callbacks, "handlers", [])
    return any(isinstance(h, AglCallbackHandler) for h in handlers)


def with_agl(runnable: R) -> R | Runnable[Any, Any]:
    """`runnable` with agl's handler bound to its config: every `invoke` / `ainvoke` / `stream` / `astream` is
    traced without passing callbacks each time. Returns a copy (a compiled LangGraph graph stays a graph; other
    runnables come back bound); the original is untouched, so it is also the way to run without agl. Binding
    twice binds once."""
    if has_agl(runnable):
        return runnable
    return runnable.with_config(callbacks=[AglCallbackHandler()])
