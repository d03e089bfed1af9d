"""Limits on what a connection may cost before its request reaches the app (issue #27, defects 2 and 3).

uvicorn's httptools protocol buffers a request's line and headers without bound and waits for them forever: one
256 MB header was read for 91 s into 500 MB of memory, and 1,100 connections that never finished their headers
used up every file descriptor, so every other request was reset. This protocol, a subclass of uvicorn's, adds:

- a cap on the bytes of the request line and headers (431, connection closed), counted as they arrive, so the
  parser never holds more than the cap and one read;
- a deadline for the headers of each request (408, connection closed), from its first byte (or from the
  connection's opening, for the first request);
- a cap on open connections: at the cap, the connection that has waited longest for a request's headers (an
  idle, slow or stalled client; never one whose response is under way) is closed to make room; when there is
  none, the new one is answered 503 with Retry-After. Each is logged, at most once every 10 s with counts, so an attack does not flood the log.

Health (`/healthz`) keeps answering under both attacks: stalled connections are shed first.
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


@dataclass(frozen=True)
class ConnectionLimits:
    max_head_bytes: int = 64 * 1024
    head_timeout_s: float = 10.0
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

    def _shed_a_stalled_connection(self) -> bool:
        stalled = [c for c in self.connections if isinstance(c, GuardedHttpToolsProtocol) and c._waiting_for_head()]
        if not stalled:
            return False
        oldest = min(stalled, key=lambda c: c._head_started)
        self.events.note(
            "shed",
            f"agl serve is at its limit of {self.max_connections} connections: closing the ones that have been"
            " sending their headers longest",
        )
        oldest._reject(408, b"Request Timeout", "closed to make room: the headers took too long", None)
        return True

    def _waiting_for_head(self) -> bool:
        """Waiting for a request's head with no response under way: idle, slow or stalled."""
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
        self._in_head = False
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(_response(status, reason, message))
            self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._start_head()  # the head's deadline runs from its first byte

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._stop_head_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        # what arrives next is the next request's head: counted from here; its deadline starts at its first byte
        self._in_head = True
        self._head_bytes = 0
        self._tail = b""
        self._head_started = time.monotonic()


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedHttpToolsProtocol]:
    """A protocol class for `uvicorn.Config(http=...)` with these limits; raises this process's open-file limit."""
    fds = raise_fd_limit()
    cap = limits.max_connections or default_max_connections(fds)
    attrs = {"limits": limits, "max_connections": cap, "events": _RateLimitedLog()}
    return type("AglHttpProtocol", (GuardedHttpToolsProtocol,), attrs)
