"""What the worker says when a rollout's LLM calls reached agl without an agent name: stored unattributed, they are
trained by no run that selects agents. Said once per worker, for a rollout whose every call lacked a name while a
hook that names agents was in place, and for one where some did, beside named calls; with the fix for the
frameworks the app loaded, which name their agents only when told to."""

from __future__ import annotations

import logging
import sys

from agl.capture.instrumentation import agent_naming_hooks
from agl.capture.tracing.context import RolloutContext

log = logging.getLogger("agl.worker")

# a framework the app imported → how its agents get a name agl reads
FRAMEWORK_FIXES = {
    "langgraph": "LangGraph names an agent only when it is made with one: `create_agent(model, tools,"
    ' name="writer")` (or `create_react_agent(..., name=...)`).',
    "dspy": 'DSPy modules carry no agent name: run each module under its name (`with agl.agent("judge"):`, or'
    ' OpenInference\'s `using_metadata({"agent_name": "judge"})`), a ChainOfThought judge as much as a ReAct agent.',
    "beeai_framework": "BeeAI's agents are named from its run contexts once `agl_otel.instrument()` has run in the"
    " rollout with BeeAI imported (OpenInference writes BeeAI's spans only after the calls); give each agent its"
    ' name (`RequirementAgent(name="solver", ...)`), or run it under `with agl.agent("solver"):`.',
}

_warned: set[str] = set()


def framework_fixes() -> str:
    """The fixes of the frameworks this process imported, as sentences."""
    return "".join(f"{fix} " for module, fix in FRAMEWORK_FIXES.items() if module in sys.modules)


def warn_unnamed_calls(ctx: RolloutContext) -> None:
    """After a rollout: once per worker for each case (none named while a naming hook is in place; some named)."""
    sent, unnamed = ctx.llm_calls_sent, ctx.llm_calls_unnamed
    if not unnamed:
        return
    if unnamed == sent:
        hooks = agent_naming_hooks()
        if "all" in _warned or not hooks:
            return
        _warned.add("all")
        seen = [report for hook in hooks if (report := hook.attribution_report(ctx.framework_spans))]
        log.warning(
            "all %d LLM call(s) of rollout %s reached agl without an agent name, though %s %s in place to name"
            " them: they are stored unattributed, and a run that selects agents (--agents) trains none of them. %s%s"
            'Name the agent in the app (`with agl.agent("name"):` around its code), or see the guide of the'
            " framework. (Said once per worker.)",
            sent,
            ctx.rollout_id,
            ", ".join(type(h).__name__ for h in hooks),
            "is" if len(hooks) == 1 else "are",
            "".join(f"{line} " for line in seen),
            framework_fixes(),
        )
        return
    if "some" in _warned:
        return
    _warned.add("some")
    named = ", ".join(f"{name} ({count})" for name, count in ctx.llm_call_agents.most_common(6))
    log.warning(
        "%d of %d LLM call(s) of rollout %s reached agl without an agent name, beside calls of %s: they are stored"
        " unattributed, and a run that selects agents (--agents) trains none of them. %s"
        'Name the agent that makes them (`with agl.agent("name"):` around its code). (Said once per worker.)',
        unnamed,
        sent,
        ctx.rollout_id,
        named,
        framework_fixes(),
    )
