"""Serving an ASGI app on a socket bound before the app starts: the one way every agl server comes up.

`agl serve`, the embedded engine's HTTP front, `agl engine` and the scripted upstream all need the same three
things: bind first (so port 0 yields the real port to announce, and connections made right after the announcement
wait in the backlog instead of being refused), then run uvicorn on that socket, in this thread or a background one.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Literal, Self

Lifespan = Literal["auto", "on", "off"]

# connections wait here between bind and the first accept; large, because the proxy's clients burst
BACKLOG = 2048


def bind(host: str, port: int = 0, *, backlog: int = BACKLOG) -> socket.socket:
    """A listening TCP socket on `host:port` (IPv6 when the host is an IPv6 address; port 0: a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restarted server rebinds a port in TIME_WAIT
    try:
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock


def url_of(sock: socket.socket) -> str:
    """`http://host:port` of a bound socket, IPv6 hosts in brackets."""
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if sock.family == socket.AF_INET6 else host
    return f"http://{shown}:{port}"


def _server(app: Any, *, log_level: str, lifespan: Lifespan, graceful_s: int | None, http: Any = "auto") -> Any:
    import uvicorn

    # loop/http "auto" pick uvloop and httptools (dependencies of agl-core) where installed; `http` may be a
    # protocol class instead (agl serve's, with limits on connections: agl.server.connections)
    config = uvicorn.Config(
        app, log_level=log_level, access_log=False, lifespan=lifespan, timeout_graceful_shutdown=graceful_s, http=http
    )
    return uvicorn.Server(config)


def serve(
    app: Any,
    sock: socket.socket,
    *,
    log_level: str = "warning",
    lifespan: Lifespan = "auto",
    graceful_s: int = 5,
    http: Any = "auto",
) -> None:
    """Run `app` on the bound `sock` in this thread until interrupted (uvicorn handles SIGINT/SIGTERM)."""
    try:
        _server(app, log_level=log_level, lifespan=lifespan, graceful_s=graceful_s, http=http).run(sockets=[sock])
    finally:
        sock.close()


class ThreadedServer:
    """`app` served from a daemon thread of this process on a socket bound at construction, so `url` is known
    before `start()`. Used as a context manager or with start()/stop()."""

    def __init__(
        self, app: Any, *, host: str = "127.0.0.1", port: int = 0, lifespan: Lifespan = "auto", name: str = "agl-http"
    ) -> None:
        self._sock = bind(host, port)
        self.url = url_of(self._sock)
        self._server = _server(app, log_level="warning", lifespan=lifespan, graceful_s=None)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        try:
            self._server.run(sockets=[self._sock])
        except SystemExit:
            pass  # uvicorn exits when the app's startup fails; it has logged why, and start() reports it

    def start(self, timeout: float = 30.0) -> Self:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                self.stop()
                raise RuntimeError(f"the HTTP server for {self.url} did not start within {timeout:g} s")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(10)
        self._sock.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
