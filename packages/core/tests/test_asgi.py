"""agl.common.asgi: bind first, announce the real URL, then serve — in this thread or a background one."""

from __future__ import annotations

import socket
from typing import Any

import httpx
import pytest

from agl.common import asgi


async def hello(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.failed", "message": "no"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": scope["path"].encode()})


def test_port_zero_is_announced_as_the_real_port_and_served() -> None:
    with asgi.ThreadedServer(hello, lifespan="off") as server:
        port = int(server.url.rsplit(":", 1)[1])
        assert port > 0 and server.url == f"http://127.0.0.1:{port}"
        assert httpx.get(f"{server.url}/ping").text == "/ping"
    with pytest.raises(httpx.ConnectError):  # stopped means the port is closed, not just idle
        httpx.get(f"{server.url}/ping", timeout=2)


def test_connections_made_before_serving_wait_in_the_backlog() -> None:
    sock = asgi.bind("127.0.0.1", 0)
    try:
        early = socket.create_connection(sock.getsockname()[:2], timeout=2)  # accepted by the kernel already
        early.close()
    finally:
        sock.close()


def test_ipv6_urls_are_bracketed() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    try:
        sock = asgi.bind("::1", 0)
    except OSError as exc:
        pytest.skip(f"cannot bind ::1 here: {exc}")
    try:
        assert asgi.url_of(sock).startswith("http://[::1]:")
    finally:
        sock.close()


def test_a_taken_port_is_an_error() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        with pytest.raises(OSError):
            asgi.bind("127.0.0.1", taken.getsockname()[1])
    finally:
        taken.close()


def test_an_app_that_fails_to_start_is_reported_with_its_url() -> None:
    server = asgi.ThreadedServer(hello, lifespan="on")
    with pytest.raises(RuntimeError, match="did not start"):
        server.start(timeout=5)
