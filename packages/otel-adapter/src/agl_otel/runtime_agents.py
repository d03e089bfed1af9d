"""The acting agent read from a framework's own runtime state, for instrumentors that name it too late.

OpenInference's LangChain instrumentor (0.1.80) and LlamaIndex instrumentor (4.6.1) start every span bare and set
all its attributes when it ends: the span of a LangGraph agent gets its `metadata` (`lc_agent_name`), and a
LlamaIndex `AgentWorkflow.run_agent_step` span its `input.value` (whose event names `current_agent_name`), only
after the agent's LLM calls were sent. A span processor, which must know the agent when a span starts
(agl_otel.processor), sees nothing there. The same names are in the frameworks' runtime state while the agent runs,
and agl reads them from there at the moment a call is made (`agl.capture.tracing.context.add_agent_resolver`):

- LangChain / LangGraph: the config of the running runnable (`langchain_core.runnables.config`'s
  `var_child_runnable_config`), whose `metadata["lc_agent_name"]` LangGraph sets for every node of an agent made
  with `create_agent` / `create_react_agent(name=...)`: what the instrumentor later copies into `metadata`;
- LlamaIndex: a span handler on its instrumentation dispatcher that remembers, per open span, the agent named by
  the event of a workflow step (`ev.current_agent_name`: `AgentWorkflow` and a lone `FunctionAgent` /
  `ReActAgent`), inherited by every span under it; the acting agent is that of the innermost open span
  (`active_span_id`).

Both read state the frameworks keep anyway; of a framework the app did not import, agl imports at most LlamaIndex's
small instrumentation package, where it is installed (its dispatcher must hear of an agent's step when it starts).
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from agl.capture.tracing.context import add_agent_resolver, remove_agent_resolver

LANGCHAIN_CONFIG = "langchain_core.runnables.config"
LANGCHAIN_AGENT_KEY = "lc_agent_name"
LLAMA_INDEX_INSTRUMENTATION = "llama_index_instrumentation"


def langchain_agent() -> tuple[str, str | None] | None:
    """The LangGraph agent whose node is running here (its `lc_agent_name`), if LangChain is in use."""
    config_module = sys.modules.get(LANGCHAIN_CONFIG)
    if config_module is None:
        return None
    config = config_module.var_child_runnable_config.get()
    metadata = (config or {}).get("metadata") or {}
    name = metadata.get(LANGCHAIN_AGENT_KEY)
    return (str(name), None) if name else None


class _LlamaIndexAgents:
    """The agent of each open LlamaIndex span (module docstring); made once LlamaIndex's instrumentation exists."""

    def __init__(self) -> None:
        from llama_index_instrumentation import get_dispatcher
        from llama_index_instrumentation.span import BaseSpan, active_span_id
        from llama_index_instrumentation.span_handlers import BaseSpanHandler

        class AgentSpan(BaseSpan):
            agent: str | None = None  # None: no agent here, still an open span its children inherit from
            named: bool = False  # the span's own event named its agent

        class AgentSpans(BaseSpanHandler[AgentSpan]):
            """Each open span's agent: the one its step's event names, else its parent's."""

            def new_span(
                self,
                id_: str,
                bound_args: Any,
                instance: Any = None,
                parent_span_id: str | None = None,
                tags: Any = None,
                **kwargs: Any,
            ) -> AgentSpan:
                event = bound_args.arguments.get("ev") if bound_args is not None else None
                named = getattr(event, "current_agent_name", None)
                parent = self.open_spans.get(parent_span_id) if parent_span_id else None
                if isinstance(named, str) and named:
                    # a workflow's steps are siblings under its run: the run's agent is the one its latest agent
                    # step named, for the steps that follow it (calling the agent's tools) until a handoff
                    if parent is not None and not parent.named:
                        parent.agent = named
                    return AgentSpan(id_=id_, parent_id=parent_span_id, agent=named, named=True)
                return AgentSpan(id_=id_, parent_id=parent_span_id, agent=parent.agent if parent else None)

            def prepare_to_exit_span(self, id_: str, *args: Any, **kwargs: Any) -> AgentSpan | None:
                return self.open_spans.get(id_)

            def prepare_to_drop_span(self, id_: str, *args: Any, **kwargs: Any) -> AgentSpan | None:
                return self.open_spans.get(id_)

        self.handler = AgentSpans()
        self.active_span_id = active_span_id
        # first among the handlers: OpenInference's starts its span in its own, and agl_otel's processor asks for
        # the acting agent right then
        get_dispatcher().span_handlers.insert(0, self.handler)

    def __call__(self) -> tuple[str, str | None] | None:
        span_id = self.active_span_id.get()
        found = self.handler.open_spans.get(span_id) if span_id else None
        return (found.agent, None) if found is not None and found.agent else None


_llama_index: _LlamaIndexAgents | None = None


def install() -> None:
    """Consult the frameworks' runtime state for the acting agent (where LlamaIndex is installed, its span handler
    is added to its dispatcher, once)."""
    global _llama_index
    add_agent_resolver(langchain_agent)
    if _llama_index is None and (
        LLAMA_INDEX_INSTRUMENTATION in sys.modules or importlib.util.find_spec(LLAMA_INDEX_INSTRUMENTATION) is not None
    ):
        _llama_index = _LlamaIndexAgents()
    if _llama_index is not None:
        add_agent_resolver(_llama_index)


def uninstall() -> None:
    remove_agent_resolver(langchain_agent)
    if _llama_index is not None:
        remove_agent_resolver(_llama_index)
