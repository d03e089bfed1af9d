"""Limits on what a connection may cost outside the app: its request's head, body and trailers, and the delivery
of its answer (issues #27 and #41).

uvicorn's httptools protocol buffers a request's line and headers without bound and waits for them forever: one
256 MB header was read for 91 s into 500 MB of memory, and 1,100 connections that never finished their headers
used up every file descriptor, so every other request was reset. It also waits forever for a body (384 connections
trickling a byte every 2 s made every other request 503 for 40 s), accumulates chunked trailers without bound
(64 MB of trailer fields took the server to 804 MB), and writes an answer to a client that has stopped reading for
as long as the client keeps its connection open. This protocol, a subclass of uvicorn's, adds:

- a cap on the bytes of the request line and headers (431, connection closed), counted as they arrive, so the
  parser never holds more than the cap and one read;
- a deadline for the headers of each request (408, connection closed), from its first byte (or from the
  connection's opening, for the first request);
- a deadline for the body, trailers included, from the end of the headers (408, connection closed; the clock
  stops while the app is not reading, which is the app's choice, not the client's), and a cap on what a chunked
  body carries besides its data (chunk lines and trailers: the header cap, 431), checked after every read;
- a deadline for a client that reads none of its answer: once the socket and the transport's buffer are full, the
  client has `send_timeout_s` to take some of it, or the connection is dropped (the app sees a hang-up: a proxied
  call is stored as abandoned), also once the answer is finished and the connection only waits to flush it;
- a cap on open connections: at the cap, the connection that has waited longest for a request's headers or body
  (an idle, slow or stalled client; never one whose answer is under way) is closed to make room; when there is
  none, the new one is answered 503 with Retry-After.

Each is logged, at most once every 10 s with counts, so an attack does not flood the log. Health (`/healthz`)
keeps answering under these attacks: stalled connections are shed first.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)

# file descriptors kept for everything besides client connections: the store, upstream pools, logs, workers
_RESERVED_FDS = 256
# what a chunk line may take besides its data ("1f4;ext=v\r\n" and the data's CRLF): beyond it, bytes of a chunked
# body that are not data count against the header cap (trailers, long chunk extensions)
_CHUNK_FRAMING = 64


@dataclass(frozen=True)
class ConnectionLimits:
    max_head_bytes: int = 64 * 1024
    head_timeout_s: float = 10.0
    body_timeout_s: float = 60.0  # 32 MB at 4 Mbit/s; a loopback or LAN client sends it in well under a second
    send_timeout_s: float = 30.0  # a client that takes no byte of its answer for this long is cut
    max_connections: int | None = None  # None: from the file-descriptor limit (`default_max_connections`)


def raise_fd_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit (capped at 1,048,576); the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    target = min(target, 1 << 20)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def default_max_connections(fd_limit: int) -> int:
    """Client connections a process with `fd_limit` descriptors can hold: each proxied call also holds one
    connection to the upstream, so half of what is left after the reserve."""
    return max(32, (fd_limit - _RESERVED_FDS) // 2)


class _RateLimitedLog:
    def __init__(self, every_s: float = 10.0) -> None:
        self.every_s = every_s
        self.last = 0.0
        self.counts: dict[str, int] = {}

    def note(self, what: str, message: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            seen = ", ".join(f"{n} × {w}" for w, n in sorted(self.counts.items()))
            log.warning("%s (in the last %g s: %s)", message, self.every_s, seen)
            self.counts = {}


def _response(status: int, reason: bytes, message: str, extra: bytes = b"") -> bytes:
    body = orjson.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}})
    head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n%s\r\n" % (
        status,
        reason,
        len(body),
        extra,
    )
    return head + body


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits above; `guarded_protocol` makes one with its settings."""

    limits: ClassVar[ConnectionLimits] = ConnectionLimits()
    max_connections: ClassVar[int] = 1024
    events: ClassVar[_RateLimitedLog]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._head_bytes = 0
        self._tail = b""
        self._head_started = time.monotonic()
        self._head_timer: asyncio.TimerHandle | None = None
        self._in_body = False
        self._body_timer: asyncio.TimerHandle | None = None
        self._framing_bytes = 0  # bytes of a chunked body that were not data: chunk lines, trailers
        self._chunks = 0
        self._data_this_read = 0
        self._send_timer: asyncio.TimerHandle | None = None
        self._refused = False

    # ------------------------------------------------------------------ connections

    def connection_made(self, transport: Any) -> None:
        if len(self.connections) >= self.max_connections and not self._shed_a_stalled_connection():
            self._refused = True
            self.events.note(
                "refused",
                f"agl serve holds {len(self.connections)} connections, its limit (--max-connections): new ones are"
                " answered 503",
            )
            transport.write(
                _response(
                    503, b"Service Unavailable", "too many open connections: retry shortly", b"retry-after: 1\r\n"
                )
            )
            transport.close()
            return
        super().connection_made(transport)
        self._start_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        self._stop_body_timer()
        self._stop_send_timer()
        if self._refused:
            return  # never counted, never parsed
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._in_head:
            room = self.limits.max_head_bytes - self._head_bytes
            # a read may hold the end of the head and the start of the body: only what comes before the blank
            # line that ends the head counts
            if len(data) > room and b"\r\n\r\n" not in self._tail + data[: max(room, 0) + 4]:
                self._reject(
                    431,
                    b"Request Header Fields Too Large",
                    f"the request line and headers are over {self.limits.max_head_bytes} bytes (agl serve"
                    " --max-header-kb)",
                    "header too large",
                )
                return
            self._head_bytes += len(data)
            self._tail = data[-3:]
            super().data_received(data)
            return
        in_body = self._in_body
        self._data_this_read = 0
        super().data_received(data)
        if in_body and self._in_body:  # a read wholly inside one body: what was not data is framing or trailers
            self._framing_bytes += len(data) - self._data_this_read
            if self._framing_bytes > self.limits.max_head_bytes + _CHUNK_FRAMING * self._chunks:
                self._reject(
                    431,
                    b"Request Header Fields Too Large",
                    f"the chunked body's trailers and chunk lines are over {self.limits.max_head_bytes} bytes"
                    " (agl serve --max-header-kb)",
                    "trailers too large",
                )

    def _shed_a_stalled_connection(self) -> bool:
        stalled = [c for c in self.connections if isinstance(c, GuardedHttpToolsProtocol) and c._waiting_for_client()]
        if not stalled:
            return False
        oldest = min(stalled, key=lambda c: c._head_started)
        self.events.note(
            "shed",
            f"agl serve is at its limit of {self.max_connections} connections: closing the ones that have been"
            " sending their headers or body longest",
        )
        oldest._reject(408, b"Request Timeout", "closed to make room: the request took too long to arrive", None)
        return True

    def _waiting_for_client(self) -> bool:
        """Waiting for a request's head or body with no answer under way: idle, slow or stalled."""
        if self._in_body:
            return self.cycle is not None and not self.cycle.response_started
        busy = self.cycle is not None and not self.cycle.response_complete
        return self._in_head and not busy

    # ------------------------------------------------------------------ one request's head

    def _start_head(self) -> None:
        self._in_head = True
        self._head_started = time.monotonic()
        self._stop_head_timer()
        self._head_timer = self.loop.call_later(self.limits.head_timeout_s, self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._in_head and self.transport is not None and not self.transport.is_closing():
            self._reject(
                408,
                b"Request Timeout",
                f"the request line and headers did not arrive within {self.limits.head_timeout_s:g} s",
                "header timeout",
            )

    def _reject(self, status: int, reason: bytes, message: str, event: str | None) -> None:
        if event is not None:
            self.events.note(event, f"agl serve closed a connection: {message}")
        self._stop_head_timer()
        self._stop_body_timer()
        self._in_head = self._in_body = False
        if self.transport is not None and not self.transport.is_closing():
            if self.cycle is None or not self.cycle.response_started:  # never write into an answer under way
                self.transport.write(_response(status, reason, message))
            self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._start_head()  # the head's deadline runs from its first byte

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._stop_head_timer()
        super().on_headers_complete()
        self._in_body = True
        self._framing_bytes = self._chunks = 0
        self._body_timer = self.loop.call_later(self.limits.body_timeout_s, self._body_timed_out)

    # ------------------------------------------------------------------ one request's body and trailers

    def on_body(self, body: bytes) -> None:
        self._data_this_read += len(body)
        super().on_body(body)

    def on_chunk_header(self) -> None:
        self._chunks += 1

    def _stop_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _body_timed_out(self) -> None:
        self._body_timer = None
        if not self._in_body or self.transport is None or self.transport.is_closing():
            return
        if self.flow.read_paused:  # the app has not taken what came: its wait, not the client's
            self._body_timer = self.loop.call_later(1.0, self._body_timed_out)
            return
        self._reject(
            408,
            b"Request Timeout",
            f"the request body did not arrive within {self.limits.body_timeout_s:g} s (agl serve --body-timeout)",
            "body timeout",
        )

    def on_message_complete(self) -> None:
        self._in_body = False
        self._stop_body_timer()
        super().on_message_complete()
        # what arrives next is the next request's head: counted from here; its deadline starts at its first byte
        self._in_head = True
        self._head_bytes = 0
        self._tail = b""
        self._head_started = time.monotonic()

    # ------------------------------------------------------------------ the answer's delivery

    def pause_writing(self) -> None:
        # the socket and the transport's buffer are full: the client has not taken what was sent
        super().pause_writing()
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.limits.send_timeout_s, self._send_timed_out)

    def resume_writing(self) -> None:
        self._stop_send_timer()
        super().resume_writing()

    def _stop_send_timer(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _send_timed_out(self) -> None:
        self._send_timer = None
        # a closing transport is cut too: once a non-streamed answer is written, keep-alive's end (or `connection:
        # close`) closes the transport, and a close waits to flush what the client never reads, for as long as it
        # keeps its socket open; a transport that did close has stopped this timer (connection_lost)
        if self.transport is None:
            return
        self.events.note(
            "stalled reader",
            f"agl serve dropped a client that read none of its answer for {self.limits.send_timeout_s:g} s"
            " (agl serve --send-timeout)",
        )
        self.transport.abort()  # close() would wait to flush what the client does not read


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedHttpToolsProtocol]:
    """A protocol class for `uvicorn.Config(http=...)` with these limits; raises this process's open-file limit."""
    fds = raise_fd_limit()
    cap = limits.max_connections or default_max_connections(fds)
    attrs = {"limits": limits, "max_connections": cap, "events": _RateLimitedLog()}
    return type("AglHttpProtocol", (GuardedHttpToolsProtocol,), attrs)
