"""The environment `agl worker` sets before it loads an agent: every SDK's base-URL variable pointed at the run's
LLM URL, so that an unchanged app's calls reach agl (docs/guides/workers.md has the table)."""

from __future__ import annotations

import logging
import os

log = logging.getLogger("agl.worker")


# The variables OpenAI-compatible clients read for their base URL when built without one (docs/guides/workers.md has
# the table): the OpenAI SDK (and the Agents SDK, Agno, Haystack, smolagents, AutoGen on top of it) and LangChain
# read OPENAI_BASE_URL; LlamaIndex, LiteLLM (DSPy, CrewAI) and LangChain's older name read OPENAI_API_BASE.
OPENAI_BASE_URL_VARIABLES = ("OPENAI_BASE_URL", "OPENAI_API_BASE")


def point_sdks_at(llm_url: str) -> None:
    """Each base-URL variable (OPENAI_BASE_URL_VARIABLES) and, when unset, a placeholder OPENAI_API_KEY, for the
    OpenAI SDK and the frameworks built on it, which read them when a client is built without a base URL: an
    unchanged app then calls agl, not the hosted API (billed, never recorded) nor the model server behind agl
    (answered, never recorded)."""
    for name in OPENAI_BASE_URL_VARIABLES:
        previous = os.environ.get(name)
        if previous and previous.rstrip("/") != llm_url.rstrip("/"):
            log.warning(
                "%s was %s: agl worker points it at this run's LLM URL %s, so that the agent's calls are"
                " recorded (--keep-openai-env leaves it as it was)",
                name,
                previous,
                llm_url,
            )
        os.environ[name] = llm_url
    # the SDK refuses to build a client without a key; agl's server takes none on loopback, and with a token the
    # attempt's own credential replaces it at send time
    os.environ.setdefault("OPENAI_API_KEY", "agl")
    # Anthropic's SDKs (and Claude Code, the Claude Agent SDK) read their base URL without the /v1 they add
    anthropic_url = llm_url.rstrip("/").removesuffix("/v1")
    previous = os.environ.get("ANTHROPIC_BASE_URL")
    if previous and previous.rstrip("/") != anthropic_url:
        log.warning(
            "ANTHROPIC_BASE_URL was %s: agl worker points it at this run's %s (--keep-openai-env leaves it)",
            previous,
            anthropic_url,
        )
    os.environ["ANTHROPIC_BASE_URL"] = anthropic_url
    os.environ.setdefault("ANTHROPIC_API_KEY", "agl")
