"""`instrument()` / `uninstrument()`: put the agl hooks into AgentChat's classes, and take them out again.

What is patched, and why there:
- `on_messages` / `on_messages_stream` of `BaseChatAgent` and of every subclass that defines its own (AgentChat
  agents override both, so patching the base class alone would miss them). Classes defined after
  `instrument()` (a user's custom agent) are patched as they are created, by a `__init_subclass__` hook.
- `on_message_impl` of `BaseGroupChatManager`: every message a group chat manager handles (hence every
  speaker selection, including the LLM calls of `SelectorGroupChat` and the Magentic-One orchestrator) runs
  as the manager, under its AutoGen name (`SelectorGroupChatManager`, ...). Only the name is set there, no
  agent span: the manager also relays every streamed event, which would make one span per chunk.

AutoGen's own event logger reports an LLM call after it was made and its OpenTelemetry spans live in
OpenTelemetry's context, so neither can name the agent while the request is being sent; the method wrappers
can.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autogen_agentchat.agents import BaseChatAgent
from autogen_agentchat.teams._group_chat._base_group_chat_manager import BaseGroupChatManager
from autogen_core import MessageContext

import agl
from agl_autogen.turns import ORIGINAL, wrap_on_messages, wrap_on_messages_stream

_AGENT_METHODS: dict[str, Callable[[Any], Any]] = {
    "on_messages": wrap_on_messages,
    "on_messages_stream": wrap_on_messages_stream,
}
_MISSING = object()


@dataclass(frozen=True)
class _Patch:
    cls: type
    name: str
    before: Any  # the class's own attribute before patching, or _MISSING when it inherited it

    def undo(self) -> None:
        if self.before is _MISSING:
            delattr(self.cls, self.name)
        else:
            setattr(self.cls, self.name, self.before)


_lock = threading.RLock()
_patches: list[_Patch] = []


def _set(cls: type, name: str, value: Any) -> None:
    _patches.append(_Patch(cls, name, cls.__dict__.get(name, _MISSING)))
    setattr(cls, name, value)


def _patch_agent_class(cls: type) -> None:
    """Wrap the turn methods `cls` itself defines (inherited ones are wrapped where they are defined)."""
    with _lock:
        for name, wrap in _AGENT_METHODS.items():
            method = cls.__dict__.get(name)
            if method is None or getattr(method, "__isabstractmethod__", False) or hasattr(method, ORIGINAL):
                continue
            _set(cls, name, wrap(method))


def _all_subclasses(cls: type) -> list[type]:
    found: list[type] = [cls]
    pending: list[type] = [cls]
    while pending:
        subclasses: list[type] = pending.pop().__subclasses__()
        for sub in subclasses:
            if sub not in found:
                found.append(sub)
                pending.append(sub)
    return found


def _patch_future_agent_classes() -> None:
    def init_subclass(cls: type[BaseChatAgent], /, **kwargs: Any) -> None:
        super(BaseChatAgent, cls).__init_subclass__(**kwargs)
        _patch_agent_class(cls)

    _set(BaseChatAgent, "__init_subclass__", classmethod(init_subclass))


def _patch_group_chat_managers() -> None:
    original = BaseGroupChatManager.on_message_impl

    @functools.wraps(original)
    async def on_message_impl(self: BaseGroupChatManager, message: Any, ctx: MessageContext) -> Any:
        if agl.current_rollout() is None:
            return await original(self, message, ctx)
        # One coroutine in one task: the name set here is unset in the same context, and the speaker-selection
        # task the manager starts inside copies it.
        token = agl.enter_agent(getattr(self, "_name", None) or type(self).__name__)
        try:
            return await original(self, message, ctx)
        finally:
            agl.exit_agent(token)

    _set(BaseGroupChatManager, "on_message_impl", on_message_impl)


def instrument() -> None:
    """Hook AgentChat so each agent's turn runs as an agl agent scope named by the agent's `name`, each tool
    call is recorded as a tool span (ok / error), and group chat managers' own LLM calls carry the manager's
    name. Idempotent; a no-op at run time outside an agl rollout."""
    with _lock:
        if _patches:
            return
        for cls in _all_subclasses(BaseChatAgent):
            _patch_agent_class(cls)
        _patch_future_agent_classes()
        _patch_group_chat_managers()


def uninstrument() -> None:
    """Remove every hook `instrument()` put in (also from agent classes defined since). Idempotent."""
    with _lock:
        while _patches:
            _patches.pop().undo()


def is_instrumented() -> bool:
    return bool(_patches)
