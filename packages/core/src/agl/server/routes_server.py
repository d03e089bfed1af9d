"""The server's own routes: whether it can work (`/healthz`), what it is (`info`), what its store holds (`stats`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse

from agl._version import __version__
from agl.server.middleware import HEALTH_PATH

if TYPE_CHECKING:
    from agl.server.context import ServerContext

API = "/api/v1"  # the REST API's prefix, shared by every route module


def add_routes(app: FastAPI, server: ServerContext) -> None:
    store = server.store

    @app.api_route(HEALTH_PATH, methods=["GET", "HEAD"], tags=["server"])
    async def healthz() -> JSONResponse:
        """Whether the server can do its work: 200 when a write reaches the store now, else 503 with why.
        Open without the token (it tells nothing else), for load balancers and supervisors."""
        status, body = await server.health()
        return JSONResponse(body, status_code=status)

    @app.get(f"{API}/info", tags=["server"])
    async def info() -> dict[str, Any]:
        return {
            "version": __version__,
            "store_writable": server.store.writer.alive,
            "served_model": server.settings.served_model,
            "upstream": server.settings.upstream.base_url,
            "engines": [e.url for e in server.proxy.engines.engines.values()],
            "auth": bool(server.settings.token),
            "max_abs_reward": server.settings.max_abs_reward,  # rewards are accepted in [-it, it]
            # what one POST /spans may hold: agl's client sends a rollout's spans in batches within them
            "max_spans_per_request": server.settings.max_spans_per_request,
            "max_body_bytes": server.settings.max_body_bytes,
            "model_version": server.proxy.model_version.version if server.proxy.model_version else None,
        }

    @app.get(f"{API}/stats", tags=["server"])
    async def stats() -> dict[str, Any]:
        counts, statuses = await run_in_threadpool(lambda: (store.counts(), store.status_counts()))
        return {"counts": counts, "rollouts_by_status": statuses}
