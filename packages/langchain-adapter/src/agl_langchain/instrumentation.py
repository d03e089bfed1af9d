"""`instrument()` / `uninstrument()`: `AglCallbackHandler` in every LangChain / LangGraph run, without passing it.

The same shape as the other agl adapters (`agl_autogen`, `agl_crewai`, `agl_openai_agents`), beside the
per-run ways (`callbacks=[AglCallbackHandler()]`, `with_agl(graph)`), which need no global state at all.
LangChain's configure hooks (`langchain_core.tracers.context.register_configure_hook`) are how its own tracers
join every run: when LangChain sets up a run's callbacks it adds the handler a registered context variable holds.
A context variable's *default* is seen in every thread and task (a value set with `.set()` would be seen only
where it was set), so agl registers one whose default is the handler. Registered with `handle_class`, the hook
adds nothing to a run that already has an `AglCallbackHandler` (bound by `with_agl` or passed in), so every
way of adding agl can be combined and the handler acts once.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, ClassVar

from langchain_core.tracers import context as lc_hooks

from agl.capture.instrumentation import Instrumentor
from agl_langchain.handler import AglCallbackHandler


class LangChainInstrumentor(Instrumentor):
    """agl's configure hook in LangChain (see the module's docstring); `agl_langchain.instrument()` runs it."""

    dependencies: ClassVar[dict[str, str]] = {"langchain_core": "'langchain-core>=1.0,<2'"}
    names_agents = True  # the worker warns when a rollout's calls got no agent name from it
    hook: ContextVar[Any] | None = None

    def _instrument(self) -> None:
        # A new variable each time: a context variable's default cannot be changed or cleared. One handler
        # shared by all runs is meant: its run state lives in `agl_langchain.handler`, not in the object.
        handler = AglCallbackHandler()
        hook: ContextVar[Any] = ContextVar("agl_langchain_handler", default=handler)
        lc_hooks.register_configure_hook(hook, True, AglCallbackHandler)  # inheritable: child runs have it too
        self.hook = hook

    def _uninstrument(self) -> None:
        hook, self.hook = self.hook, None
        # LangChain has no call to unregister a hook: take agl's own entry out of the list it reads, in place
        # (`langchain_core.callbacks.manager` holds the same list object).
        lc_hooks._configure_hooks[:] = [entry for entry in lc_hooks._configure_hooks if entry[0] is not hook]

    def _in_place(self) -> bool:
        return any(entry[0] is self.hook for entry in lc_hooks._configure_hooks)


def instrument() -> None:
    """Trace every LangChain / LangGraph run in this process with `AglCallbackHandler`: LLM calls attributed to
    their agent, tool runs recorded as tool spans. Idempotent; inert outside an agl rollout."""
    LangChainInstrumentor().instrument()


def uninstrument() -> None:
    """Remove what `instrument()` registered (runs bound with `with_agl` keep their handler). Idempotent."""
    LangChainInstrumentor().uninstrument()


def is_instrumented() -> bool:
    return LangChainInstrumentor().is_instrumented()
