"""Pure-ASGI guards in front of every route: the bearer token and the request-body size limit.

Written as raw ASGI (not Starlette's BaseHTTPMiddleware) so that streaming answers pass straight through and
the proxy's added latency stays small.
"""

from __future__ import annotations

import hmac
from typing import Any

import orjson

Scope = dict[str, Any]
ASGIApp = Any


async def _reject(
    send: Any, status: int, message: str, type_: str, extra_headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = orjson.dumps({"error": {"message": message, "type": type_, "param": None, "code": None}})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra_headers or [])})
    await send({"type": "http.response.body", "body": body})


class BearerTokenMiddleware:
    """Every route requires `Authorization: Bearer <token>` (agents send it as their OpenAI api key)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = b""
        for key, value in scope["headers"]:
            if key == b"authorization":
                given = value
                break
        if not hmac.compare_digest(given, self.expected):
            why = "missing" if not given else "wrong"
            await _reject(
                send,
                401,
                f"{why} bearer token: this server requires 'Authorization: Bearer <token>'",
                "authentication_error",
                [(b"www-authenticate", b"Bearer")],
            )
            return
        await self.app(scope, receive, send)


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
