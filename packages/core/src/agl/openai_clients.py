"""OpenAI SDK clients for rollouts that share one connection pool per process (per event loop, for async).

Every rollout has its own proxy URL, so an agent naturally builds a new client per rollout; but a new
`openai.OpenAI` costs 20-40 ms of CPU (httpx loads the TLS certificate store), more than the rest of a small
agent's rollout. `with_options` on one shared client gives a client for the rollout's URL that reuses the
pool, for about 30 µs. The `openai` package is imported only when these are called: agl-core does not depend
on it.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import openai

    from agl.decorator import LLM

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
