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
import warnings
from collections.abc import Callable
from typing import Any, ClassVar

from autogen_agentchat.agents import BaseChatAgent
from autogen_agentchat.teams._group_chat._base_group_chat_manager import BaseGroupChatManager
from autogen_core import MessageContext

import agl
from agl.capture.instrumentation import Instrumentor
from agl.common.failure import add_hint, remove_hint
from agl_autogen.turns import ORIGINAL, wrap_on_messages, wrap_on_messages_stream

_AGENT_METHODS: dict[str, Callable[[Any], Any]] = {
    "on_messages": wrap_on_messages,
    "on_messages_stream": wrap_on_messages_stream,
}


# AgentChat's error when a team is run while it is already running: what a module-level team does under a worker
# that runs several rollouts at once
TEAM_RUNNING = "The group chat is currently running"
TEAM_RUNNING_HINT = (
    "agl: this team object is shared by rollouts running at the same time in one worker (a team built at import "
    "time): build the team inside the rollout function, or run the worker with --concurrency 1"
)


# the start of the warning AutoGen's OpenAI client gives when an answer names another model than it resolved
MODEL_MISMATCH = "Resolved model mismatch"


def _matches_mismatch(pattern: object) -> bool:
    return getattr(pattern, "pattern", None) == MODEL_MISMATCH


class AutoGenInstrumentor(Instrumentor):
    """agl's hooks in AgentChat (see the module's docstring); `agl_autogen.instrument()` runs this one."""

    dependencies: ClassVar[dict[str, str]] = {"autogen_agentchat": "'autogen-agentchat>=0.7,<0.8'"}
    names_agents = True  # the worker warns when a rollout's calls got no agent name from it

    def _instrument(self) -> None:
        add_hint(TEAM_RUNNING, TEAM_RUNNING_HINT)
        # AutoGen compares the model an answer names with the dated model it resolved the client's name to
        # (gpt-4o → gpt-4o-2024-08-06) and warns on every call when they differ, which they always do under agl
        # (the policy answers, under the upstream's name): agl says which model served each call itself
        warnings.filterwarnings("ignore", message=MODEL_MISMATCH, category=UserWarning)
        for cls in _all_subclasses(BaseChatAgent):
            self.patch_agent_class(cls)
        self._patch_future_agent_classes()
        self.wrap(BaseGroupChatManager, "on_message_impl", _as_the_manager)

    def _uninstrument(self) -> None:
        remove_hint(TEAM_RUNNING)
        kept = [f for f in warnings.filters if not (f[0] == "ignore" and _matches_mismatch(f[1]))]
        warnings.filters[:] = kept  # type: ignore[index]  # a list at run time, typed as a Sequence

    def patch_agent_class(self, cls: type) -> None:
        """Wrap the turn methods `cls` itself defines (inherited ones are wrapped where they are defined)."""
        for name, wrap in _AGENT_METHODS.items():
            method = cls.__dict__.get(name)
            if method is None or getattr(method, "__isabstractmethod__", False) or hasattr(method, ORIGINAL):
                continue
            self.replace(cls, name, wrap(method))

    def _patch_future_agent_classes(self) -> None:
        def init_subclass(cls: type[BaseChatAgent], /, **kwargs: Any) -> None:
            super(BaseChatAgent, cls).__init_subclass__(**kwargs)
            self.patch_agent_class(cls)

        # BaseChatAgent inherits `__init_subclass__`: the undo deletes it rather than copying object's in
        self.replace(BaseChatAgent, "__init_subclass__", classmethod(init_subclass))


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


def _as_the_manager(original: Callable[..., Any]) -> Callable[..., Any]:
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

    return on_message_impl


def instrument() -> None:
    """Hook AgentChat so each agent's turn runs as an agl agent scope named by the agent's `name`, each tool
    call is recorded as a tool span (ok / error), and group chat managers' own LLM calls carry the manager's
    name. Idempotent; a no-op at run time outside an agl rollout."""
    AutoGenInstrumentor().instrument()


def uninstrument() -> None:
    """Remove every hook `instrument()` put in (also from agent classes defined since). Idempotent."""
    AutoGenInstrumentor().uninstrument()


def is_instrumented() -> bool:
    return AutoGenInstrumentor().is_instrumented()
