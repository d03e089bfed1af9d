"""A bare pass-through proxy on agl serve's own HTTP stack (uvicorn with httptools and agl's guarded protocol, a raw
ASGI app, one aiohttp session to the upstream), forwarding only: no parsing, no checks, no record, no store. It
is the limit the proxy's cost is measured against (bench_proxy.py): what any proxy on this stack costs on this
machine, so that the ratio does not move with the machine's speed.

    python benchmarks/perf/_bare_proxy.py UPSTREAM_V1_URL     # prints `BARE_PROXY_READY <url>`
"""

from __future__ import annotations

import sys
from typing import Any

import aiohttp

from agl.common import asgi
from agl.server.connections import ConnectionLimits, guarded_protocol

READY = "BARE_PROXY_READY"


class BareProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.session: aiohttp.ClientSession | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            if self.session is not None:
                await self.session.close()
            await send({"type": "lifespan.shutdown.complete"})
            return
        if self.session is None:  # as the proxy's: a pool as large as its default, kept alive, no total timeout
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=1024, limit_per_host=0, keepalive_timeout=60),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10.0),
            )
        body = bytearray()
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        path = scope["path"].split("/v1", 1)[-1]
        headers = {"content-type": "application/json", "accept-encoding": "identity"}
        # A pooled connection the upstream closed as it was taken (its keep-alive ran out between the benchmark's
        # rounds) fails before anything is answered: tried again once on a fresh one, as any client would. Past that
        # the failure is a 502 saying why (an exception here was a bare 500, and the benchmark stopped on it).
        started = False
        for attempt in range(2):
            try:
                async with self.session.post(f"{self.upstream}{path}", data=bytes(body), headers=headers) as resp:
                    media = resp.headers.get("content-type", "application/json").encode()
                    start = {
                        "type": "http.response.start",
                        "status": resp.status,
                        "headers": [(b"content-type", media)],
                    }
                    await send(start)
                    started = True
                    async for chunk in resp.content.iter_any():
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    await send({"type": "http.response.body", "body": b""})
                    return
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                if started:  # half an answer is out: nothing to do but fail the connection
                    raise
                if attempt == 0:
                    continue
                said = f"bare proxy: upstream failed: {type(exc).__name__}: {exc}".encode()
                await send(
                    {"type": "http.response.start", "status": 502, "headers": [(b"content-type", b"text/plain")]}
                )
                await send({"type": "http.response.body", "body": said})


def main() -> None:
    sock = asgi.bind("127.0.0.1", 0)
    print(f"{READY} {asgi.url_of(sock)}", flush=True)
    asgi.serve(BareProxy(sys.argv[1]), sock, log_level="error", http=guarded_protocol(ConnectionLimits()))


if __name__ == "__main__":
    main()
