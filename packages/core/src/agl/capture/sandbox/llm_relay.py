"""The sandbox's one way to agl: a relay on a Unix socket that carries the attempt's LLM calls and nothing else.

Inside the sandbox the command's `OPENAI_BASE_URL` / `ANTHROPIC_BASE_URL` name `http://127.0.0.1:PORT/rollout/R/
attempt/A/...`; the sandbox's first process carries each connection to this socket (supervisor.py), and here each
request is checked before it goes on to agl's server:

- only the attempt's own LLM routes (`/rollout/R/attempt/A/v1/...`, or `.../agent/NAME/v1/...`): no rewards, spans,
  completion, engines or dashboard, whatever credential the command sends, and whether or not the server has a token;
- one request per connection, its body framed by `Content-Length` or chunked encoding and cut there, so nothing can
  be smuggled behind it;
- the command's own `Authorization` / `x-api-key` dropped and the attempt's LLM credential put in their place: the
  command holds no credential at all (its keys are placeholders).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import ssl
import threading
from urllib.parse import urlsplit

_MAX_HEAD = 64 * 1024
_HEAD_TIMEOUT_S = 60.0
_MAX_DISCARD = 2**20
_DROP = {
    b"authorization", b"x-api-key", b"host", b"connection", b"keep-alive", b"proxy-authorization",
    b"proxy-connection", b"upgrade", b"te",
}  # fmt: skip
_SAFE_TARGET = re.compile(r"^/[A-Za-z0-9._~!$&'()*+,;=:@%/-]*(\?[A-Za-z0-9._~!$&'()*+,;=:@%/?-]*)?$")
_TRICKS = re.compile(r"(^|/)\.\.?(/|$|\?)|%2e|%2f|%5c", re.IGNORECASE)


class LlmRelay:
    """Listens on `socket_path` for the duration of a `with` block (a thread of its own)."""

    def __init__(self, *, socket_path: str, server_url: str, attempt_path: str, credential: str | None) -> None:
        url = urlsplit(server_url)
        self.socket_path = socket_path
        self.host = url.hostname or "127.0.0.1"
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.tls = url.scheme == "https"
        self.host_header = url.netloc.rpartition("@")[2].encode()
        # `/rollout/R/attempt/A`, then either `/v1/` or `/agent/NAME/v1/` (the agent's name percent-encoded)
        self.allowed = re.compile(re.escape(attempt_path.rstrip("/")) + r"(/agent/[^/?]+)?/v1/[^?]")
        self.credential = credential
        self.refused: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="agl-llm-relay", daemon=True)
        self._error: BaseException | None = None

    def __enter__(self) -> LlmRelay:
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            server = self._loop.run_until_complete(asyncio.start_unix_server(self._handle, path=self.socket_path))
        except OSError as exc:
            self._error = exc
            self._ready.set()
            return
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
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _HEAD_TIMEOUT_S)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ConnectionError):
            writer.close()
            return
        if len(head) > _MAX_HEAD:
            await _answer(writer, 431, "request head too large")
            return
        request_line, _, rest = head[:-4].partition(b"\r\n")
        parts = request_line.decode("latin-1").split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            await _answer(writer, 400, "not an HTTP/1.x request")
            return
        method, target, _ = parts
        headers = [line.partition(b":") for line in rest.split(b"\r\n") if line]
        lengths = [v.strip() for k, _, v in headers if k.strip().lower() == b"content-length"]
        chunked = any(k.strip().lower() == b"transfer-encoding" and b"chunked" in v.lower() for k, _, v in headers)
        if (lengths and chunked) or len(set(lengths)) > 1 or (lengths and not lengths[0].isdigit()):
            await _answer(writer, 400, "ambiguous request body length")
            return
        if not self._may(target):
            self.refused.append(f"{method} {target[:200]}")
            if lengths:  # read what the client is sending (within reason), so that it gets the answer, not a reset
                with contextlib.suppress(asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError):
                    await asyncio.wait_for(_discard(reader, min(int(lengths[0]), _MAX_DISCARD)), 5)
            await _answer(writer, 403, f"agl sandbox: only this attempt's LLM routes are reachable, not {target[:200]}")
            return
        kept = [k.strip() + b": " + v.strip() for k, _, v in headers if k.strip().lower() not in _DROP]
        kept += [b"Host: " + self.host_header, b"Connection: close"]
        if self.credential:
            kept.append(b"Authorization: Bearer " + self.credential.encode())
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, ssl=ssl.create_default_context() if self.tls else None),
                30,
            )
        except (OSError, asyncio.TimeoutError) as exc:
            await _answer(writer, 502, f"agl sandbox relay: agl's server unreachable: {exc}")
            return
        up_writer.write(b"\r\n".join([request_line, *kept, b"", b""]))
        try:
            if chunked:
                await _copy_chunked(reader, up_writer)
            elif lengths:
                await _copy_exactly(reader, up_writer, int(lengths[0]))
            await up_writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            up_writer.close()
            writer.close()
            return
        await _pipe(up_reader, writer)
        up_writer.close()

    def _may(self, target: str) -> bool:
        return bool(_SAFE_TARGET.match(target)) and not _TRICKS.search(target) and bool(self.allowed.match(target))


async def _discard(reader: asyncio.StreamReader, size: int) -> None:
    while size > 0:
        chunk = await reader.read(min(size, 65536))
        if not chunk:
            return
        size -= len(chunk)


async def _copy_exactly(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, size: int) -> None:
    while size > 0:
        chunk = await reader.read(min(size, 65536))
        if not chunk:
            raise asyncio.IncompleteReadError(b"", size)
        writer.write(chunk)
        await writer.drain()
        size -= len(chunk)


async def _copy_chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Forward a chunked body as it is, up to and including its last chunk and trailers, and nothing after it."""
    while True:
        line = await reader.readuntil(b"\r\n")
        size = int(line.split(b";", 1)[0].strip(), 16)
        writer.write(line)
        if size == 0:
            while True:  # trailers, then the empty line that ends the body
                trailer = await reader.readuntil(b"\r\n")
                writer.write(trailer)
                if trailer == b"\r\n":
                    return
        await _copy_exactly(reader, writer, size)
        writer.write(await reader.readexactly(2))


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while chunk := await source.read(65536):
            sink.write(chunk)
            await sink.drain()
    except ConnectionError:
        pass
    finally:
        with contextlib.suppress(Exception):
            sink.close()


async def _answer(writer: asyncio.StreamWriter, status: int, message: str) -> None:
    body = json.dumps({"error": {"message": message, "type": "permission_error"}}).encode()
    reason = {400: "Bad Request", 403: "Forbidden", 431: "Request Header Fields Too Large", 502: "Bad Gateway"}
    head = f"HTTP/1.1 {status} {reason[status]}\r\ncontent-type: application/json\r\n"
    writer.write(head.encode() + f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode() + body)
    with contextlib.suppress(ConnectionError):
        await writer.drain()
    writer.close()
