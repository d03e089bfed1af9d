"""Answer caches an agent's framework keeps, turned off in `agl worker` through their documented settings.

A cached answer reaches no engine: its call is never stored, the rollout succeeds with its reward and trains
nothing, and nothing says so. DSPy caches every LM answer on disk and in memory by default (`dspy.LM(cache=True)`),
so a group's later rollouts of one task, and a second worker on the same tasks, stored 0 calls. LiteLLM (under
DSPy, Agno's instrumentor, Aider) reads its model price list from the network at import unless told to use its
bundled copy (~7 s a worker start, and an egress the sandbox counts).

`AGL_KEEP_ANSWER_CACHES=1` leaves them as the app set them."""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger("agl.worker")

KEEP_ENV = "AGL_KEEP_ANSWER_CACHES"
_turned_off: set[str] = set()


def keep_caches() -> bool:
    return os.environ.get(KEEP_ENV, "") not in ("", "0")


def quiet_framework_env() -> None:
    """Before the agent's module is imported: LiteLLM's bundled price list (`LITELLM_LOCAL_MODEL_COST_MAP`)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def turn_off_answer_caches() -> None:
    """Before each rollout: DSPy's answer cache off (`dspy.configure_cache`), once DSPy is loaded by the agent."""
    if "dspy" in _turned_off or keep_caches():
        return
    dspy = sys.modules.get("dspy")
    configure = getattr(dspy, "configure_cache", None)
    if configure is None:
        return
    configure(enable_disk_cache=False, enable_memory_cache=False)
    _turned_off.add("dspy")
    log.warning(  # said once per worker: the app's setting was changed
        "agl worker turned DSPy's answer cache off: a cached answer reaches no engine and trains nothing"
        " (%s=1 keeps it)",
        KEEP_ENV,
    )
