"""Tell the proxy which agent sends each LLM request, by adding headers to the agent's own HTTP requests.

The OpenAI SDK, and through it LangChain, AutoGen, the OpenAI Agents SDK and most others, send requests with
httpx. Patching `httpx.Client.send` / `httpx.AsyncClient.send` catches every such request whatever transport
the client uses. Headers are added only to requests for the current rollout's proxy URL (nothing leaks to
other hosts) and computed at send time, so the scope that is active when a request leaves is the one named.
The proxy answers with the call's sequence number, which positions later rewards exactly.
"""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import quote

import httpx

from agl.tracing import attributes as attr
from agl.tracing.context import RolloutContext, current_agent, current_rollout, current_span_id

_lock = threading.Lock()
_originals: dict[str, Any] = {}


def attribution_headers(ctx: RolloutContext | None = None) -> dict[str, str]:
    """Headers that attribute a request to the current agent; for clients that agl does not patch."""
    ctx = ctx or current_rollout()
    headers: dict[str, str] = {}
    agent = current_agent()
    if agent is not None:
        # HTTP header values are ASCII: a name such as "Rédacteur" travels percent-encoded (UTF-8)
        headers[attr.HEADER_AGENT] = quote(agent, safe=" !#$&'()*+,-./:;<=>?@[]^_`{|}~")
    span_id = current_span_id()
    if span_id is not None:
        headers[attr.HEADER_PARENT_SPAN] = span_id
        if ctx is not None:
            headers[attr.HEADER_TRACEPARENT] = f"00-{ctx.trace_id}-{span_id}-01"
    return headers


def _prepare(request: httpx.Request) -> RolloutContext | None:
    ctx = current_rollout()
    if ctx is None or not str(request.url).startswith(ctx.llm_base_url):
        return None
    for key, value in attribution_headers(ctx).items():
        request.headers[key] = value
    return ctx


def _note_seq(ctx: RolloutContext | None, response: httpx.Response) -> None:
    if ctx is None:
        return
    seq = response.headers.get(attr.HEADER_LLM_SEQ)
    if seq is not None and seq.isdigit():
        ctx.saw_llm_seq(int(seq))


def install() -> None:
    """Patch httpx so requests to the proxy carry the agent's name. Idempotent."""
    with _lock:
        if _originals:
            return
        sync_send = httpx.Client.send
        async_send = httpx.AsyncClient.send

        def send(self: httpx.Client, request: httpx.Request, **kwargs: Any) -> httpx.Response:
            ctx = _prepare(request)
            response = sync_send(self, request, **kwargs)
            _note_seq(ctx, response)
            return response

        async def asend(self: httpx.AsyncClient, request: httpx.Request, **kwargs: Any) -> httpx.Response:
            ctx = _prepare(request)
            response = await async_send(self, request, **kwargs)
            _note_seq(ctx, response)
            return response

        _originals["sync"], _originals["async"] = sync_send, async_send
        httpx.Client.send = send  # type: ignore[method-assign]
        httpx.AsyncClient.send = asend  # type: ignore[method-assign]


def uninstall() -> None:
    """Undo `install()`. Idempotent."""
    with _lock:
        if not _originals:
            return
        httpx.Client.send = _originals.pop("sync")  # type: ignore[method-assign]
        httpx.AsyncClient.send = _originals.pop("async")  # type: ignore[method-assign]


def installed() -> bool:
    return bool(_originals)
