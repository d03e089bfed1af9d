"""Tell the proxy which agent sends each LLM request, by adding headers to the agent's own HTTP requests.

The supported frameworks send their LLM requests through the OpenAI SDK or their own code on one of a few HTTP
stacks: `httpx` (openai < 3, LangChain, LiteLLM) and `httpx2` (openai ≥ 3, whose transport subclasses
`httpx2.Client`, not `httpx.Client`). Patching `Client.send` / `AsyncClient.send` of every such stack that is
installed catches each request whatever transport the client uses. A stack that is not installed is not
imported. Headers are added only to requests for the current rollout's proxy URL, or for the run's fixed LLM URL
(`{server}/v1`, where the rollout and attempt travel as headers too), so nothing leaks to other hosts; they are
computed at send time, so the rollout and scope active when a request leaves are the ones named — which is what
lets one client built at import time serve every rollout.

Every request that passes through the hook also carries `x-agl-hook`, even outside agent scopes: a call that
reaches the proxy without it came through a client agl does not patch, and if its attempt opened agent scopes,
the agent name it should have carried was lost. The proxy and the runner count such calls and say so (never a
silent loss of attribution). The proxy answers with the call's sequence number, which positions later rewards
exactly.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, unquote

from agl.capture.instrumentation import Instrumentor, importable
from agl.capture.tracing.context import (
    RolloutContext,
    current_agent,
    current_agent_key,
    current_rollout,
    current_span_id,
    external_llm_intended,
)
from agl.common import attributes as attr

# Modules with httpx's client API (`Client.send(request, **kw)`, `AsyncClient.send`, `request.url`/`.headers`)
# through which a supported framework sends LLM requests.
HTTP_STACKS = ("httpx", "httpx2")
# the path of an attempt's proxy URL (see agl.capture.tracing.context.llm_base_url)
_PROXY_PATH = re.compile(r"/rollout/[^/]+/attempt/[^/]+/v1/")
# what an LLM API's routes end with (OpenAI's chat completions, completions and Responses; Anthropic's messages):
# such a request sent inside a rollout to a host other than agl's is a call agl never sees
_LLM_ROUTE = re.compile(r"/(chat/completions|completions|responses|messages)/?$")
_BYPASS = "agl_bypassed"  # a request's extension: the rollout whose call went elsewhere than agl
_HEADER_SAFE = " !#$&'()*+,-./:;<=>?@[]^_`{|}~"  # what an agent name keeps as it is in a header (ASCII only)


def attribution_headers(ctx: RolloutContext | None = None) -> dict[str, str]:
    """Headers that attribute a request to the current agent; for clients that agl does not patch."""
    ctx = ctx or current_rollout()
    headers: dict[str, str] = {attr.HEADER_HOOK: "1"}
    agent = current_agent()
    if agent is not None:
        # HTTP header values are ASCII: a name such as "Rédacteur" travels percent-encoded (UTF-8)
        headers[attr.HEADER_AGENT] = quote(agent, safe=_HEADER_SAFE)
        key = current_agent_key()
        if key is not None:
            headers[attr.HEADER_AGENT_KEY] = quote(key, safe=_HEADER_SAFE)
    span_id = current_span_id()
    if span_id is not None:
        headers[attr.HEADER_PARENT_SPAN] = span_id
        if ctx is not None:
            headers[attr.HEADER_TRACEPARENT] = f"00-{ctx.trace_id}-{span_id}-01"
    return headers


def _prepare(request: Any) -> RolloutContext | None:
    ctx = current_rollout()
    url = str(request.url)
    if ctx is None:
        # A request for a rollout's proxy URL made where the rollout's context did not follow (a thread started
        # by hand): it did pass the hook, so it is stored as unattributed, not blamed on an unpatched client.
        if _PROXY_PATH.search(url):
            request.headers[attr.HEADER_HOOK] = "1"
        return None
    if url.startswith(ctx.llm_base_url):
        pass
    elif not url.startswith(ctx.server_url.rstrip("/") + "/") and _LLM_ROUTE.search(request.url.path):
        intended = external_llm_intended(str(request.url.host), request.url.port)
        ctx.sent_llm_call_elsewhere(url.split("?", 1)[0], intended=intended)
        if not intended:  # what became of it is noted when it comes back (or does not)
            request.extensions[_BYPASS] = ctx
        return None
    elif url.startswith(ctx.fixed_llm_base_url + "/") and not url.startswith(ctx.fixed_llm_base_url + "/traces"):
        # the run's one LLM URL (a client built at import time): the ids a proxy URL has in its path travel as
        # headers, and the attempt's own credential replaces whatever key the client was built with
        request.headers[attr.HEADER_ROLLOUT_ID] = ctx.rollout_id
        request.headers[attr.HEADER_ATTEMPT_ID] = ctx.attempt_id
        if ctx.credential is not None:
            request.headers["authorization"] = f"Bearer {ctx.credential}"
    else:
        return None
    headers = attribution_headers(ctx)
    for key, value in headers.items():
        request.headers[key] = value
    agent = headers.get(attr.HEADER_AGENT)
    ctx.sent_llm_call(agent=unquote(agent) if agent is not None else None)
    return ctx


def _note_seq(ctx: RolloutContext | None, response: Any) -> None:
    if ctx is None:
        return
    seq = response.headers.get(attr.HEADER_LLM_SEQ)
    if seq is not None and seq.isdigit():
        ctx.saw_llm_seq(int(seq))


def _note_bypass(request: Any, response: Any) -> None:
    """A call that bypassed agl came back (`response`) or reached no server (None): its rollout counts which."""
    ctx = request.extensions.pop(_BYPASS, None) if hasattr(request, "extensions") else None
    if ctx is not None:
        ctx.bypass_answered(None if response is None else int(response.status_code))


def _wrap_sync(original: Callable[..., Any]) -> Callable[..., Any]:
    def send(self: Any, request: Any, **kwargs: Any) -> Any:
        ctx = _prepare(request)
        try:
            response = original(self, request, **kwargs)
        except Exception:
            _note_bypass(request, None)
            raise
        _note_bypass(request, response)
        _note_seq(ctx, response)
        return response

    send.__agl_original__ = original  # type: ignore[attr-defined]
    return send


def _wrap_async(original: Callable[..., Any]) -> Callable[..., Any]:
    async def send(self: Any, request: Any, **kwargs: Any) -> Any:
        ctx = _prepare(request)
        try:
            response = await original(self, request, **kwargs)
        except Exception:
            _note_bypass(request, None)
            raise
        _note_bypass(request, response)
        _note_seq(ctx, response)
        return response

    send.__agl_original__ = original  # type: ignore[attr-defined]
    return send


class HttpInstrumentor(Instrumentor):
    """Patches `Client.send` / `AsyncClient.send` of every stack in `HTTP_STACKS` that is installed (any of them
    will do: httpx is agl-core's own dependency, httpx2 comes with openai >= 3)."""

    stacks: tuple[str, ...] = ()  # those patched by the last `instrument()`

    def _instrument(self) -> None:
        for name in HTTP_STACKS:
            if not importable(name):
                continue
            module = importlib.import_module(name)
            self.wrap(module.Client, "send", _wrap_sync)
            self.wrap(module.AsyncClient, "send", _wrap_async)
            self.stacks = (*self.stacks, name)

    def _uninstrument(self) -> None:
        self.stacks = ()


def install() -> None:
    """Patch every installed HTTP stack so requests to the proxy carry the agent's name. Idempotent."""
    HttpInstrumentor().instrument()


def uninstall() -> None:
    """Undo `install()` on every stack it patched. Idempotent."""
    HttpInstrumentor().uninstrument()


def installed() -> bool:
    return HttpInstrumentor().is_instrumented()


def patched_stacks() -> list[str]:
    """The HTTP client libraries whose requests are attributed (those installed when `install()` ran)."""
    return sorted(HttpInstrumentor().stacks)
