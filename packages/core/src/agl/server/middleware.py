"""Pure-ASGI guards in front of every route: the bearer token and the request-body size limit.

Written as raw ASGI (not Starlette's BaseHTTPMiddleware) so that streaming answers pass straight through and
the proxy's added latency stays small.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from functools import partial
from typing import Any
from urllib.parse import parse_qs, urlencode

from agl.protocol import error_bytes
from agl.server.credentials import LLM_PREFIX, PREFIX, attempt_may, attempt_of, llm_attempt_of, llm_may
from agl.server.request_cost import heavy_lane
from agl.server.span_caps import LOCKED_WALK_BYTES, TooManySpans, check_json_containers

Scope = dict[str, Any]
ASGIApp = Any


async def _reject(
    send: Any, status: int, message: str, type_: str, extra_headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = error_bytes(message, type_)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra_headers or [])})
    await send({"type": "http.response.body", "body": body})


UI_PREFIX = "/ui"
HEALTH_PATH = "/healthz"
UI_COOKIE = "agl_ui"


def ui_cookie_value(token: str) -> str:
    """What the dashboard's cookie holds: derived from the token, so a leaked cookie does not give the API token."""
    return hmac.new(token.encode(), b"agl dashboard", hashlib.sha256).hexdigest()


def _is_ui(path: str) -> bool:
    return path == UI_PREFIX or path.startswith(UI_PREFIX + "/")


class BearerTokenMiddleware:
    """Every route requires `Authorization: Bearer <token>` (agents send it as their OpenAI api key). The scheme
    is case-insensitive (RFC 7235); the token is compared in constant time.

    The dashboard (`/ui`) is opened by a browser, which cannot send that header on a navigation: `/ui?token=T`
    once sets an HttpOnly, SameSite=Strict cookie (scoped to /ui, derived from the token) and redirects to the
    same page without the token in its address; the cookie then opens `/ui` and its API only."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token
        self.expected = token.encode()
        self.ui_cookie = ui_cookie_value(token).encode()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"] == HEALTH_PATH:  # open to load balancers; it answers nothing but healthy or not
            await self.app(scope, receive, send)
            return
        if _is_ui(scope["path"]) and await self._ui(scope, receive, send):
            return
        given = api_key = b""
        for key, value in scope["headers"]:
            if key == b"authorization":
                given = value
            elif key == b"x-api-key":  # Anthropic's SDKs send their key here, not as a bearer token
                api_key = value
        if not given and api_key:
            given = b"Bearer " + api_key.strip()
        scheme, _, credential = given.strip().partition(b" ")
        credential = credential.strip()
        is_bearer = scheme.lower() == b"bearer"
        if is_bearer and credential.startswith(LLM_PREFIX.encode()):
            attempt_id = llm_attempt_of(self.token, credential)
            if attempt_id is not None:
                if not llm_may(attempt_id, scope["path"]):
                    await _reject(
                        send,
                        403,
                        f"this is the LLM-only credential of attempt {attempt_id}: it opens that attempt's LLM routes"
                        f" (/rollout/<rollout>/attempt/{attempt_id}/v1/...) and nothing else, not"
                        f" {scope['method']} {scope['path'][:200]}; rewards, spans, heartbeats and completion are"
                        " reported by the worker, never by the agent's own programs",
                        "permission_error",
                    )
                    return
                scope["agl.attempt"] = attempt_id
                await self.app(scope, receive, send)
                return
        if is_bearer and credential.startswith(PREFIX.encode()):
            attempt_id = attempt_of(self.token, credential)
            if attempt_id is not None:
                if not attempt_may(attempt_id, scope["method"], scope["path"]):
                    await _reject(
                        send,
                        403,
                        f"this credential belongs to attempt {attempt_id}: it opens that attempt's proxy URL and"
                        " its own reports only",
                        "permission_error",
                    )
                    return
                scope["agl.attempt"] = attempt_id  # the handlers check what is reported belongs to it
                await self.app(scope, receive, send)
                return
        if not is_bearer or not hmac.compare_digest(credential, self.expected):
            why = "missing" if not given else "wrong"
            await _reject(
                send,
                401,
                f"{why} bearer token: this server requires 'Authorization: Bearer <token>'"
                + (" (in a browser, open /ui?token=<token> once)" if _is_ui(scope["path"]) else ""),
                "authentication_error",
                [(b"www-authenticate", b"Bearer")],
            )
            return
        await self.app(scope, receive, send)

    async def _ui(self, scope: Scope, receive: Any, send: Any) -> bool:
        """Let a dashboard request in by its cookie, or trade `?token=` for the cookie; True when answered."""
        for key, value in scope["headers"]:
            if key == b"cookie":
                for part in value.split(b";"):
                    name, _, given = part.strip().partition(b"=")
                    if name == UI_COOKIE.encode() and hmac.compare_digest(given, self.ui_cookie):
                        await self.app(scope, receive, send)
                        return True
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        offered = query.pop("token", [None])[0]
        if offered is None or not hmac.compare_digest(offered.encode(), self.expected):
            return False  # the bearer header may still open it; else the usual 401
        rest = urlencode(query, doseq=True)
        location = scope["path"] + (f"?{rest}" if rest else "")
        cookie = f"{UI_COOKIE}={self.ui_cookie.decode()}; Path={UI_PREFIX}; HttpOnly; SameSite=Strict"
        headers = [(b"location", location.encode()), (b"set-cookie", cookie.encode()), (b"content-length", b"0")]
        await send({"type": "http.response.start", "status": 303, "headers": headers})
        await send({"type": "http.response.body", "body": b""})
        return True


class BodyTooLarge(Exception):
    pass


class BodySizeLimitMiddleware:
    """Refuse request bodies over `max_bytes` with 413, whether or not they announce a Content-Length."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for key, value in scope["headers"]:
            if key == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await _reject(
                    send,
                    413,
                    f"request body of {int(value)} bytes is over the limit of {self.max_bytes}"
                    " bytes (agl serve --max-body-mb)",
                    "invalid_request_error",
                )
                return
        seen = 0
        started = False
        overflowed = False
        message_413 = f"request body is over the limit of {self.max_bytes} bytes (agl serve --max-body-mb)"

        async def counted_receive() -> Any:
            nonlocal seen, overflowed
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    overflowed = True
                    raise BodyTooLarge
            return message

        async def tracked_send(message: Any) -> None:
            nonlocal started
            if overflowed:  # the app may have turned BodyTooLarge into its own error: answer 413 instead
                if message["type"] == "http.response.start" and not started:
                    started = True
                    await _reject(send, 413, message_413, "invalid_request_error")
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except BodyTooLarge:
            if not started:
                await _reject(send, 413, message_413, "invalid_request_error")


class SpanBodyGuard:
    """Counts the spans of a `POST /api/v1/spans` body, and the objects and lists it opens, before FastAPI decodes
    it: 30 MB of spans took 988 MB to decode before the route could count them (issue #41, N4). A body past the
    span cap (`--max-spans-per-request`) or opening far more structures than its spans could is refused with 413,
    undecoded; any other is handed on as it came."""

    def __init__(self, app: ASGIApp, path: str, max_spans: int) -> None:
        self.app = app
        self.path = path
        self.max_spans = max_spans

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != self.path:
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left before its body came
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        named = body.count(b'"span_id"')  # every span names its span_id
        try:
            if named > self.max_spans:
                raise TooManySpans(
                    f"this request holds {named} spans, over the limit of {self.max_spans} per request: send them"
                    " in smaller batches (agl serve --max-spans-per-request)"
                )
            if len(body) > LOCKED_WALK_BYTES:  # its count may walk the body string by string: not on the loop
                await heavy_lane(partial(check_json_containers, body, named, what="this spans body"))
            else:
                check_json_containers(body, named, what="this spans body")
        except TooManySpans as exc:
            await _reject(send, 413, str(exc), "invalid_request_error")
            return
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


# Media types a route accepts in a request body: JSON everywhere, protobuf or JSON for OTLP.
_JSON = (b"application/json",)
_OTLP = (b"application/json", b"application/x-protobuf")


class BrowserGuardMiddleware:
    """Keeps web pages away from a server on loopback, where the token is optional.

    - DNS rebinding: a page on attacker.example that resolves its own name to 127.0.0.1 reaches this server
      with `Host: attacker.example`; only the names this server is reached by are accepted (`localhost`,
      loopback addresses, the bound address, `--allowed-host`). A wildcard bind (0.0.0.0) requires a token,
      which pages cannot send, and accepts any Host unless names are given.
    - Cross-site "simple requests": a page may POST text/plain, form data or a body without a content type
      to any origin without asking first. Every state change here takes JSON (protobuf for OTLP) and says so
      in Content-Type, which a page can only send after a CORS preflight this server never approves. A
      request whose Origin is another site is refused outright.
    """

    def __init__(
        self, app: ASGIApp, allowed_hosts: frozenset[str] | None, takes_post: Callable[[Scope], bool] | None = None
    ) -> None:
        self.app = app
        self.allowed_hosts = allowed_hosts  # lower-case names without port; None: any
        self.takes_post = takes_post  # whether a route takes POST at this path; None: every path does

    def _host_allowed(self, value: bytes) -> bool:
        if self.allowed_hosts is None:
            return True
        host = value.decode("latin-1").strip().lower()
        if host.startswith("["):  # [::1]:8765
            host = host[1 : host.find("]")] if "]" in host else host
        elif host.count(":") == 1:
            host = host.split(":", 1)[0]
        return host in self.allowed_hosts

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = origin = content_type = None
        for key, value in scope["headers"]:
            if key == b"host":
                host = value
            elif key == b"origin":
                origin = value
            elif key == b"content-type":
                content_type = value
        if host is not None and not self._host_allowed(host):
            await _reject(
                send,
                400,
                f"this server does not answer to Host {host.decode('latin-1')[:100]!r}: reach it as localhost or"
                " its bound address, or start it with --allowed-host NAME",
                "invalid_request_error",
            )
            return
        if origin is not None and origin != b"null":
            origin_host = origin.split(b"://", 1)[-1]
            if not self._host_allowed(origin_host):
                await _reject(send, 403, "cross-site requests are refused (Origin of another site)", "permission_error")
                return
        # POST to a route that takes it: the one method here that takes a body (any other request is answered 405
        # or 404 unread), and the only one besides GET a page may send cross-site without a preflight
        if scope["method"] == "POST" and (self.takes_post is None or self.takes_post(scope)):
            otlp = scope["path"] == "/v1/traces"
            accepted = _OTLP if otlp else _JSON
            media = (content_type or b"").split(b";", 1)[0].strip().lower()
            if media not in accepted:
                shown = media.decode("latin-1")[:60] or "none"
                await _reject(
                    send,
                    415,
                    f"content type {shown!r} is not accepted here: send {' or '.join(a.decode() for a in accepted)}",
                    "invalid_request_error",
                )
                return
            if not otlp:
                for key, value in scope["headers"]:
                    if key == b"content-encoding" and value.strip().lower() not in (b"", b"identity"):
                        await _reject(
                            send,
                            415,
                            "compressed request bodies are accepted only by /v1/traces (OTLP)",
                            "invalid_request_error",
                        )
                        return
        await self.app(scope, receive, send)


class Inflated(Exception):
    """A compressed body that inflates past the limit."""


def inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """`body` decompressed (gzip or deflate), never holding more than `limit` bytes of output: a 300 KB
    body can inflate to 300 MB. Raises `Inflated` past the limit, ValueError if it is not valid."""
    import zlib

    wbits = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}.get(encoding)
    if wbits is None:
        raise ValueError(f"content encoding {encoding!r} is not supported: use gzip, deflate or none")
    inflater = zlib.decompressobj(wbits)
    out = bytearray()
    chunk = 64 * 1024
    view = memoryview(body)
    try:
        for start in range(0, len(body), chunk):
            data: bytes | memoryview = view[start : start + chunk]
            while data:
                out += inflater.decompress(data, limit + 1 - len(out))
                if len(out) > limit:
                    raise Inflated
                data = inflater.unconsumed_tail
        out += inflater.flush(limit + 1 - len(out))
    except zlib.error as exc:
        raise ValueError(f"body is not valid {encoding}: {exc}") from None
    if len(out) > limit:
        raise Inflated
    if not inflater.eof:
        raise ValueError(f"body is not valid {encoding}: it ends early")
    return bytes(out)


# The dashboard loads only its own script and stylesheet and is never meant to be framed: a page elsewhere can
# neither run code in it, nor frame it to trick a click, nor have a response sniffed into another type.
_UI_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self';"
        b" object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    ),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]


class DashboardHeadersMiddleware:
    """Adds the security headers above to every answer under `/ui`, errors included."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not _is_ui(scope["path"]):
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                present = {k.lower() for k, _ in message.get("headers", [])}
                extra = [(k, v) for k, v in _UI_HEADERS if k not in present]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, with_headers)
