"""The run's fixed LLM URL: `http://HOST:PORT/v1/...` serves every rollout, the ids travelling in headers.

A client built once, at import time or by a framework's global default, cannot carry each rollout's proxy URL.
agl's HTTP hook adds `x-agl-rollout-id` / `x-agl-attempt-id` at send time from the running rollout's context
(agl.capture.tracing.http_inject); this middleware turns such a request into the one the per-rollout URL would have
made, before any guard looks at it, so the proxy, the credential checks and every route behave exactly alike.
A request there with no rollout context is refused with the reason: it belongs to no rollout, and agl never
guesses one.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote, unquote

from agl.protocol import HEADER_AGENT, HEADER_ATTEMPT_ID, HEADER_ROLLOUT_ID, SUB_AGENT_LABEL, error_bytes

# the LLM routes of the proxy, as a per-rollout URL serves them below `.../v1`
_LLM_PATH = re.compile(r"^/v1/(chat/completions|responses|messages|messages/count_tokens)/?$")
_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,200}$")  # ids become a path segment: nothing that could change the path
# an attempt's URL naming its agent (see FixedUrlMiddleware): rollout, attempt, agent (percent-encoded), the rest
_AGENT_PATH = re.compile(r"^/rollout/([^/]+)/attempt/([^/]+)/agent/([^/]+)/v1/(.*)$")
_AGENT = HEADER_AGENT.encode()
_HEADER_SAFE = " !#$&'()*+,-./:;<=>?@[]^_`{|}~"  # as agl's HTTP hook sends a name (agl.capture.tracing.http_inject)
_ROLLOUT = HEADER_ROLLOUT_ID.encode()
_ATTEMPT = HEADER_ATTEMPT_ID.encode()
# How the coding harnesses mark a sub-agent's calls (neither documents it; read from their requests): Claude Code
# 2.1 sends `x-claude-code-agent-id: <random id>` on every call of an `Agent`-tool sub-agent (no kind); Codex 0.171
# sends `x-openai-subagent: <kind>`. A random id would make every run's sub-agent a new agent, so Claude Code's
# become one name; Codex's kind is kept when it is a plain label.
_CLAUDE_CODE_SUB_AGENT = b"x-claude-code-agent-id"
_CODEX_SUB_AGENT = b"x-openai-subagent"
_LABEL = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")

NO_ROLLOUT = (
    "this LLM call reached agl's fixed URL outside any rollout (no x-agl-rollout-id header): make it while a "
    "rollout runs (inside the agent function, or in a thread started with agl.propagate) so agl can attribute it, "
    "or send it to the model's own URL; nothing was stored"
)


REFUSAL = "agl.fixed_url_refusal"  # the scope key carrying why a fixed-URL call cannot be taken


class FixedUrlMiddleware:
    """Outermost: a call at the fixed URL with its rollout's headers becomes the per-rollout call. One without
    them is only marked: `FixedUrlRefusal`, inside the guards, answers it, so a caller without the token learns
    nothing from the refusal (it gets the token guard's 401 first).

    An attempt's URL may also name the agent that calls it, `/rollout/R/attempt/A/agent/NAME/v1/...`: for a
    process agl's HTTP hook is not in (a command-line agent, `agl.run_cli`), whose calls carry no agent header;
    the call becomes the attempt's own with NAME as its agent header, as the hook would have sent it. A call there
    that a harness marks as its sub-agent's is stored as `NAME/<label>` (`sub_agent_label`), so `--agents NAME`
    trains the harness's own turns, `NAME/subagent` its sub-agents, and `'NAME*'` both."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and (named := _AGENT_PATH.match(scope["path"])) is not None:
            path = f"/rollout/{named[1]}/attempt/{named[2]}/v1/{named[4]}"
            headers = [(k, v) for k, v in scope["headers"] if k != _AGENT]
            agent = unquote(named[3])
            if (label := sub_agent_label(headers)) is not None:
                agent = f"{agent}/{label}"
            headers.append((_AGENT, quote(agent, safe=_HEADER_SAFE).encode()))
            scope = {**scope, "path": path, "raw_path": path.encode(), "headers": headers}
        if scope["type"] != "http" or not _LLM_PATH.match(scope["path"]):
            await self.app(scope, receive, send)
            return
        rollout = attempt = None
        for key, value in scope["headers"]:
            if key == _ROLLOUT:
                rollout = value.decode("latin-1")
            elif key == _ATTEMPT:
                attempt = value.decode("latin-1")
        if rollout is None or attempt is None:
            await self.app({**scope, REFUSAL: (409, NO_ROLLOUT, "no_rollout")}, receive, send)
            return
        if not (_ID.match(rollout) and _ID.match(attempt)):
            bad = (400, "x-agl-rollout-id / x-agl-attempt-id are not agl ids", "invalid_request_error")
            await self.app({**scope, REFUSAL: bad}, receive, send)
            return
        path = f"/rollout/{rollout}/attempt/{attempt}{scope['path']}"
        await self.app({**scope, "path": path, "raw_path": path.encode()}, receive, send)


def sub_agent_label(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The label a harness's sub-agent call gets after its agent's name, or None for the harness's own calls: its
    kind when it says one that is a plain label (`[A-Za-z0-9_.-]`, at most 64), else `subagent`, so a header can
    never reshape the name beyond one more segment."""
    for key, value in headers:
        if key == _CODEX_SUB_AGENT:
            kind = value.decode("latin-1").strip()
            return kind if _LABEL.match(kind) else SUB_AGENT_LABEL
        if key == _CLAUDE_CODE_SUB_AGENT:
            return SUB_AGENT_LABEL
    return None


class FixedUrlRefusal:
    """Answers the fixed-URL calls `FixedUrlMiddleware` could not take, once the guards have let them through."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        refusal = scope.get(REFUSAL)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, message, type_ = refusal
        await _answer(send, status, message, type_)


async def _answer(send: Any, status: int, message: str, type_: str) -> None:
    body = error_bytes(message, type_)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
