"""`LLM`: where an agent's LLM is, and OpenAI SDK clients for it that share one connection pool per process.

Every rollout has its own proxy URL, so an agent naturally builds a new client per rollout; but a new
`openai.OpenAI` costs 20-40 ms of CPU (httpx loads the TLS certificate store), more than the rest of a small
agent's rollout. `with_options` on one shared client gives a client for the rollout's URL that reuses the
pool, for about 30 µs. The `openai` package is imported only when these are called: agl-core does not depend
on it. (The handle and the pools live in one module: the handle hands out the pools' clients.)
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

if TYPE_CHECKING:
    import asyncio

    import openai


@dataclass(frozen=True)
class LLM:
    """Where the agent's LLM is: an OpenAI-compatible endpoint that records every call of this rollout."""

    base_url: str
    model: str
    api_key: str = "agl"

    @property
    def anthropic_base_url(self) -> str:
        """The same endpoint for Anthropic's SDKs, which add `/v1/messages` to their base URL themselves:
        `anthropic.Anthropic(base_url=llm.anthropic_base_url, api_key=llm.api_key)`."""
        return self.base_url.rstrip("/").removesuffix("/v1")

    def for_agent(self, agent: str) -> LLM:
        """This endpoint for a process agl's HTTP hook is not in (a command-line agent): its URL names `agent`
        (`.../agent/NAME/v1`), so its calls are stored under that agent without agl's headers."""
        return LLM(agent_url(self, agent), self.model, self.api_key)

    def openai_kwargs(self) -> dict[str, str]:
        """`openai.OpenAI(**llm.openai_kwargs())` builds a client for this endpoint."""
        return {"base_url": self.base_url, "api_key": self.api_key}

    def openai_client(self, **options: Any) -> openai.OpenAI:
        """An `openai.OpenAI` for this endpoint sharing the process's connection pool: much cheaper than
        building a new client per rollout (see the module's docstring). `options` as for `with_options`."""
        return shared_openai(self, **options)

    def async_openai_client(self, **options: Any) -> openai.AsyncOpenAI:
        """An `openai.AsyncOpenAI` for this endpoint sharing the running loop's connection pool."""
        return shared_async_openai(self, **options)


def agent_url(llm: LLM, agent: str | None) -> str:
    """The attempt's LLM URL, naming `agent` when given (`.../agent/NAME/v1`)."""
    if agent is None:
        return llm.base_url
    return f"{llm.anthropic_base_url}/agent/{quote(agent, safe='')}/v1"  # the URL without its /v1, as there


_lock = threading.Lock()
_sync_root: openai.OpenAI | None = None
# An AsyncOpenAI's pool belongs to the loop it first ran on, so async clients are shared per loop.
_async_roots: dict[int, tuple[asyncio.AbstractEventLoop, openai.AsyncOpenAI]] = {}


def shared_openai(llm: LLM, **options: Any) -> openai.OpenAI:
    import openai

    global _sync_root
    with _lock:
        if _sync_root is None or _sync_root.is_closed():
            _sync_root = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key)
        root = _sync_root
    return root.with_options(base_url=llm.base_url, api_key=llm.api_key, **options)


def shared_async_openai(llm: LLM, **options: Any) -> openai.AsyncOpenAI:
    import asyncio  # here, not at the top: `@agl.rollout` loads this module and must stay light

    import openai

    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # no loop yet: nothing to share with
        return openai.AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, **options)
    with _lock:
        entry = _async_roots.get(id(loop))
        if entry is None or entry[0] is not loop or entry[1].is_closed():
            for key, (other, _) in list(_async_roots.items()):
                if other.is_closed():
                    del _async_roots[key]
            entry = (loop, openai.AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key))
            _async_roots[id(loop)] = entry
    return entry[1].with_options(base_url=llm.base_url, api_key=llm.api_key, **options)
