"""What a command-line agent connects to besides agl: a loopback HTTP proxy that `agl.run_cli` puts in the command's
environment (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY, with agl's own address and loopback in NO_PROXY).

agl's HTTP hook counts an in-process agent's calls that bypass agl; a separate program (Claude Code, Codex, a
shell command the agent runs) is out of its reach. The programs these harnesses are built on (Node's and Bun's
fetch with proxy support, Rust's reqwest, Python's httpx, requests and urllib, curl, git, pip) send their
connections through the proxy the environment names, so each one is seen here: its `host:port` is counted, then
the connection is either forwarded (`record`) or refused with a 403 (`refuse`). A program that ignores the proxy
variables (raw sockets) is not seen: this is an account of what an agent reaches, not a sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from typing import Literal
from urllib.parse import urlsplit

EgressMode = Literal["record", "refuse", "allow"]
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
_MAX_HEAD = 64 * 1024


class EgressRecorder:
    """The proxy, in a thread of its own for the duration of a `with` block. `hosts` counts connections by target."""

    def __init__(
        self, *, refuse: bool, own: set[str] | None = None, unix_path: str | None = None, count: bool = True
    ) -> None:
        self.refuse = refuse
        self.count = count  # False: forward without counting (a sandbox whose task allows the network)
        self.unix_path = unix_path  # listen there instead of on loopback (a sandbox's relay, agl.capture.sandbox)
        self.own = own or set()  # agl's own `host:port`: forwarded, never counted (NO_PROXY should keep it away)
        self.hosts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="agl-egress", daemon=True)
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def environment(self, no_proxy: list[str]) -> dict[str, str]:
        """The variables that route the command's connections through this proxy, except to `no_proxy` hosts."""
        hosts = ",".join(dict.fromkeys(["localhost", "127.0.0.1", "::1", *no_proxy]))
        return {**{name: self.url for name in PROXY_VARIABLES}, "NO_PROXY": hosts, "no_proxy": hosts}

    def __enter__(self) -> EgressRecorder:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def seen(self) -> dict[str, int]:
        with self._lock:
            return dict(self.hosts)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        if self.unix_path is not None:
            server = self._loop.run_until_complete(asyncio.start_unix_server(self._handle, path=self.unix_path))
        else:
            server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
            self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            for task in asyncio.all_tasks(self._loop):
                task.cancel()
            with contextlib.suppress(Exception):
                self._loop.run_until_complete(asyncio.sleep(0))
            self._loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ConnectionError):
            writer.close()
            return
        request_line, _, rest = head.partition(b"\r\n")
        parts = request_line.decode("latin-1").split()
        target = _target(parts)
        if target is None:
            await _answer(writer, 400, "agl egress recorder: not a proxy request")
            return
        host, port, origin_form = target
        where = f"{host}:{port}"
        if where not in self.own and self.count:
            with self._lock:
                self.hosts[where] += 1
            if self.refuse:
                await _answer(writer, 403, f"agl: this rollout's agent may not connect to {where}")
                return
        try:
            up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(host, port), 30)
        except (OSError, asyncio.TimeoutError) as exc:
            await _answer(writer, 502, f"agl egress recorder: {where} unreachable: {exc}")
            return
        if parts[0].upper() == "CONNECT":
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:  # plain HTTP: the request in origin form, one request per connection (the next may be another host)
            headers = [h for h in rest.split(b"\r\n") if h and not h.lower().startswith((b"proxy-", b"connection:"))]
            line = f"{parts[0]} {origin_form} {parts[2] if len(parts) > 2 else 'HTTP/1.1'}".encode("latin-1")
            up_writer.write(b"\r\n".join([line, *headers, b"Connection: close", b"", b""]))
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer), return_exceptions=True)


def _target(parts: list[str]) -> tuple[str, int, str] | None:
    """(host, port, the path to send) of a CONNECT or an absolute-URI request; None for anything else."""
    if len(parts) < 2:
        return None
    if parts[0].upper() == "CONNECT":
        host, _, port = parts[1].rpartition(":")
        return (host.strip("[]"), int(port), "") if host and port.isdigit() else None
    url = urlsplit(parts[1])
    if url.scheme != "http" or not url.hostname:
        return None
    path = url.path or "/"
    return url.hostname, url.port or 80, f"{path}?{url.query}" if url.query else path


async def _answer(writer: asyncio.StreamWriter, status: int, message: str) -> None:
    body = message.encode()
    reason = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway"}[status]
    head = f"HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain\r\ncontent-length: {len(body)}\r\n"
    writer.write(head.encode() + b"connection: close\r\n\r\n" + body)
    with contextlib.suppress(ConnectionError):
        await writer.drain()
    writer.close()


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while chunk := await source.read(65536):
            sink.write(chunk)
            await sink.drain()
    finally:
        with contextlib.suppress(Exception):
            sink.close()
