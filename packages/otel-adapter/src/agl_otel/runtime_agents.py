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

OpenInference's BeeAI instrumentor (0.1.30) goes further: it writes no span at all until the run's outermost agent
has finished. BeeAI keeps the running `RunContext` in a context variable (`beeai_framework.context.storage`), and
every run's start and finish reach its root emitter with the run's id and its parent's:

- BeeAI: a listener on the root emitter (`Emitter.root().on`, as the instrumentor listens) that gives each run
  the agent it belongs to: the run's own instance when that is an agent (`BaseAgent`, named by `meta.name`: a
  `RequirementAgent(name=...)`, else its class name), else its parent run's; a `HandoffTool`'s target runs under
  the tool, so its calls are its own. A call's agent is that of the run in the context variable (the chat model's).

All three read state the frameworks keep anyway; of a framework the app did not import, agl imports at most
LlamaIndex's small instrumentation package, where it is installed (its dispatcher must hear of an agent's step when
it starts). BeeAI's listener is added by the first `agl_otel.instrument()` that runs with BeeAI imported.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from typing import Any

from agl.capture.tracing.context import add_agent_resolver, remove_agent_resolver

LANGCHAIN_CONFIG = "langchain_core.runnables.config"
LANGCHAIN_AGENT_KEY = "lc_agent_name"
LLAMA_INDEX_INSTRUMENTATION = "llama_index_instrumentation"
BEEAI = "beeai_framework"


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


class _BeeAIAgents:
    """The agent of each running BeeAI run (module docstring); made once BeeAI is imported."""

    def __init__(self) -> None:
        from beeai_framework.agents import BaseAgent
        from beeai_framework.context import RunContext, storage
        from beeai_framework.emitter import Emitter, EmitterOptions, EventMeta

        self.storage = storage
        self.agents: dict[str, str | None] = {}  # run id → its agent, while the run runs
        _fill_openinference_beeai_table()

        def run_edge(event: EventMeta) -> bool:
            return event.name in ("start", "finish") and isinstance(event.creator, RunContext)

        def note(_: Any, event: EventMeta) -> None:
            run = event.creator
            if not isinstance(run, RunContext):  # run_edge let only runs through: never fail BeeAI's run here
                return
            if event.name == "finish":
                self.agents.pop(run.run_id, None)
                return
            instance = run.instance
            if isinstance(instance, BaseAgent):
                self.agents[run.run_id] = instance.meta.name or type(instance).__name__
            else:
                self.agents[run.run_id] = self.agents.get(run.parent_id) if run.parent_id else None

        # blocking: the run's body (and its LLM calls) starts only once every blocking listener has heard it start
        self.cleanup = Emitter.root().on(run_edge, note, EmitterOptions(match_nested=True, is_blocking=True))

    def __call__(self) -> tuple[str, str | None] | None:
        run = self.storage.get(None)
        name = self.agents.get(run.run_id) if run is not None else None
        return (name, None) if name else None


def _fill_openinference_beeai_table() -> None:
    """OpenInference's BeeAI instrumentor (0.1.30) fills its table of span writers on first use and marks it filled
    before filling it (`ProcessorLocator._load`): two runs starting at once in threads, as a worker's rollouts do,
    can find it half-filled, and the agent of one is then written as a bare span named after its class, with no
    agent name, and its tools under no agent. Filled here, once, before any rollout's run; a later instrumentor
    without the table is left alone."""
    if "openinference.instrumentation.beeai" not in sys.modules:
        return
    try:
        from openinference.instrumentation.beeai.processors.locator import ProcessorLocator

        ProcessorLocator._load()
    except (ImportError, AttributeError):
        return


_llama_index: _LlamaIndexAgents | None = None
_beeai: _BeeAIAgents | None = None
_installing = threading.Lock()  # a worker's rollouts each call agl_otel.instrument(), at once: one of each made


def install() -> None:
    """Consult the frameworks' runtime state for the acting agent (where LlamaIndex is installed, its span handler
    is added to its dispatcher, once; where BeeAI is imported, a listener to its root emitter, once)."""
    global _llama_index, _beeai
    add_agent_resolver(langchain_agent)
    with _installing:
        if _llama_index is None and (
            LLAMA_INDEX_INSTRUMENTATION in sys.modules
            or importlib.util.find_spec(LLAMA_INDEX_INSTRUMENTATION) is not None
        ):
            _llama_index = _LlamaIndexAgents()
        if _beeai is None and BEEAI in sys.modules:
            _beeai = _BeeAIAgents()
    if _llama_index is not None:
        add_agent_resolver(_llama_index)
    if _beeai is not None:
        add_agent_resolver(_beeai)


def awaited() -> bool:
    """Whether a framework imported since `install()` still waits for its reader (BeeAI, imported after an
    `agl_otel.instrument()` at start-up): the next `instrument()` then installs again instead of returning."""
    return _beeai is None and BEEAI in sys.modules


def uninstall() -> None:
    remove_agent_resolver(langchain_agent)
    if _llama_index is not None:
        remove_agent_resolver(_llama_index)
    if _beeai is not None:
        remove_agent_resolver(_beeai)
