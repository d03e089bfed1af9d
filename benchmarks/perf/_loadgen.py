"""A minimal keep-alive HTTP/1.1 load generator on asyncio streams.

A general-purpose client (httpx) spends more CPU per request than the servers under test, and on a 2-core
machine the load generator's cost lands on the measurement; at concurrency 32 httpx's connection pool alone
cut direct throughput to a quarter. This client does only what a benchmark needs: POST a fixed body on a kept-alive
connection and read the answer (Content-Length or chunked) to its end.
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit


class Connection:
    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.path = parts.path or "/"
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def post(self, body: bytes) -> tuple[int, bytes]:
        if self.reader is None or self.writer is None:
            await self.open()
        assert self.reader is not None and self.writer is not None
        head = (
            f"POST {self.path} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode()
        self.writer.write(head + body)
        status_line = await self.reader.readline()
        status = int(status_line.split()[1])
        length = -1
        chunked = False
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            key, _, value = line.decode("latin-1").partition(":")
            key = key.strip().lower()
            if key == "content-length":
                length = int(value)
            elif key == "transfer-encoding" and "chunked" in value.lower():
                chunked = True
        if chunked:
            data = bytearray()
            while True:
                size = int((await self.reader.readline()).split(b";")[0], 16)
                if size == 0:
                    await self.reader.readline()
                    break
                data += await self.reader.readexactly(size)
                await self.reader.readline()
            return status, bytes(data)
        return status, await self.reader.readexactly(length) if length >= 0 else b""

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def run_round(url: str, body: bytes, n: int, concurrency: int) -> tuple[list[float], float]:
    """Send `n` requests over `concurrency` connections; returns per-request latencies and the elapsed time."""
    latencies: list[float] = []
    remaining = [n]
    connections = [Connection(url) for _ in range(concurrency)]
    for conn in connections:
        await conn.open()

    async def pump(conn: Connection) -> None:
        while remaining[0] > 0:
            remaining[0] -= 1
            t0 = time.perf_counter()
            status, data = await conn.post(body)
            latencies.append(time.perf_counter() - t0)
            if status != 200:
                raise RuntimeError(f"{url} answered {status}: {data[:300]!r}")

    t0 = time.perf_counter()
    try:
        await asyncio.gather(*(pump(c) for c in connections))
    finally:
        for conn in connections:
            conn.close()
    return latencies, time.perf_counter() - t0
