"""What passes between the proxy and the two ends of a call: the streamed answer that notices when its agent hung
up, the wait for a hang-up, and an upstream answer read up to a cap."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse

from agl.server.call_record import MALFORMED, CallRecord


class BadAnswer(Exception):
    """The upstream's answer cannot be used (too large, a redirect, malformed): a 502 to the agent, stored."""


class AnsweredResponse(Response):
    """A whole answer the backend gave, with what the proxy parsed of it (`answer`): a translated route translates
    that instead of parsing the bytes a second time (a large answer's parse holds the interpreter)."""

    def __init__(self, content: bytes, answer: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.answer = answer


class RelayResponse(StreamingResponse):
    """A streamed answer that notes on its call's record when the agent hung up before the stream ended.

    Starlette stops a stream whose client left by cancelling it; which await the cancellation lands on (the
    backend's next bytes, the store's commit, a send) says nothing about what the agent received. What does is
    whether the disconnect came before the stream was handed over whole: then the agent did not act on this
    answer, and the call is stored as abandoned, not trainable."""

    def __init__(self, content: AsyncIterator[bytes], rec: CallRecord, **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.rec = rec

    async def listen_for_disconnect(self, receive: Any) -> None:
        await super().listen_for_disconnect(receive)
        self.rec.abandoned = True  # before Starlette cancels the stream, so the relay sees it

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        except ClientDisconnect:  # ASGI 2.4 servers report the hang-up as a failed send instead
            self.rec.abandoned = True
            raise
        finally:
            # a cancelled `async for` leaves the relay suspended; close it now, not whenever it is collected, so
            # the call is stored (or marked) while the request is still being answered
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(BaseException):
                    await aclose()


async def hung_up(request: Request) -> None:
    """Returns when the client disconnects (its body was read already, so the next message is the hang-up)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def read_capped(resp: aiohttp.ClientResponse, cap: int) -> bytes:
    """The answer's body, read as it comes; BadAnswer past `cap` bytes (a runaway answer is never held whole)."""
    if resp.content_length is not None and resp.content_length > cap:
        raise BadAnswer(f"the answer is {resp.content_length} bytes, more than the {cap} agl reads")
    body = bytearray()
    async for chunk in resp.content.iter_any():
        body += chunk
        if len(body) > cap:
            raise BadAnswer(f"the answer is more than the {cap} bytes agl reads")
    return bytes(body)


def error_message(parsed: Any, content: bytes, status: int) -> str:
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        return str(parsed["error"].get("message") or parsed["error"])
    if isinstance(parsed, dict) and "error" in parsed:
        return str(parsed["error"])
    text = content[:500].decode(errors="replace")
    return f"HTTP {status}: {text}" if text else f"HTTP {status}"


def take_event(event: bytes, rec: CallRecord) -> bool:
    """Take one SSE event of a chat stream into its call's record; True when it is the stream's `[DONE]`."""
    done = False
    for line in event.split(b"\n"):
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            done = True
            continue
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            if rec.error is None:
                rec.error = f"{MALFORMED}: a streamed event's data is not JSON: {data[:200]!r}"
            continue
        if isinstance(chunk, dict) and "error" in chunk:
            rec.error = error_message(chunk, data, 200)
        else:
            rec.take_chunk(chunk)  # a malformed chunk is noted on the record, not taken
    return done
