"""The run dashboard `agl serve` shows at `/ui` (read-only), and the JSON API its pages read.

Registered on the server's FastAPI app by `add_routes`; it sits behind the same guards as every other route
(with `--token`, a browser opens `/ui?token=...` once and gets a cookie, see agl.server.middleware). Pages are
rendered on the server (agl.server.dashboard.pages); the table's reads are SQL on the store's file
(agl.server.dashboard.queries); the curve and the transitions come from the trainer's files in the run directory
(agl.server.dashboard.run_files).
"""

from __future__ import annotations

import time
from html import escape as html_escape
from importlib import resources
from typing import Any

from fastapi import FastAPI, Query
from starlette.concurrency import run_in_threadpool
from starlette.responses import HTMLResponse, JSONResponse, Response

from agl.protocol import error_body
from agl.server.dashboard import pages, queries, run_files
from agl.store import NotFoundError

_STATIC = {"app.css": "text/css; charset=utf-8", "app.js": "text/javascript; charset=utf-8"}
_PAGE_METHODS = ["GET", "HEAD"]  # browsers and link checkers ask with HEAD too
_AGENTS_TTL_S = 10.0  # the agent list scans every stored call: recomputed at most this often


def add_routes(app: FastAPI, server: Any) -> None:
    """Add the dashboard's pages and API routes to `app` (`server`: the `agl.server.app.Server` serving it)."""
    store_path = server.store.path
    run_dir = server.settings.run_dir
    agents_cache: list[Any] = [0.0, []]

    def agent_names() -> list[str]:
        if time.monotonic() - agents_cache[0] > _AGENTS_TTL_S:
            agents_cache[:] = [time.monotonic(), queries.agents(store_path)]
        return list(agents_cache[1])

    def html(text: str) -> HTMLResponse:
        return HTMLResponse(text, headers={"cache-control": "no-store"})

    @app.api_route("/ui", methods=_PAGE_METHODS, include_in_schema=False)
    async def overview_page() -> Response:
        counts = await run_in_threadpool(queries.overview, store_path)
        rows = await run_in_threadpool(run_files.metrics, run_dir)  # read once for the curve and the steps
        engines = server.proxy.engines.usage()
        return html(pages.overview(run_dir.name, counts, run_files.curve_of(rows), run_files.steps_of(rows), engines))

    @app.api_route("/ui/rollouts", methods=_PAGE_METHODS, include_in_schema=False)
    async def rollouts_page(
        status: str | None = None,
        mode: str | None = None,
        step: str | None = None,
        agent: str | None = None,
        min_reward: str | None = None,
        max_reward: str | None = None,
        after: str | None = None,
    ) -> Response:
        try:
            flt = _filter(status, mode, step, agent, min_reward, max_reward)
            page = await run_in_threadpool(queries.rollouts_page, store_path, flt, after=after or None)
        except ValueError as exc:
            return JSONResponse(error_body(str(exc), "invalid_request_error"), status_code=400)
        names = await run_in_threadpool(agent_names)
        return html(pages.rollouts(page, flt, names, first_page=not after))

    @app.api_route("/ui/rollouts/{rollout_id}", methods=_PAGE_METHODS, include_in_schema=False)
    async def rollout_page(rollout_id: str) -> Response:
        try:
            detail = await run_in_threadpool(server.store.rollout_detail, rollout_id)
        except NotFoundError as exc:
            body = pages.layout("not found", f"<h1>Not found</h1><p>{html_escape(str(exc))}</p>", active="rollouts")
            return HTMLResponse(body, status_code=404)
        rows = await run_in_threadpool(run_files.transitions, run_dir, rollout_id, detail.rollout.step)
        return html(pages.rollout(detail, rows))

    @app.api_route("/ui/static/{name}", methods=_PAGE_METHODS, include_in_schema=False)
    async def static(name: str) -> Response:
        if name not in _STATIC:
            return JSONResponse(error_body(f"no static file {name!r}", "invalid_request_error"), status_code=404)
        body = resources.files(__package__).joinpath("static", name).read_bytes()
        return Response(body, media_type=_STATIC[name], headers={"cache-control": "no-cache"})

    @app.get("/ui/api/overview", tags=["dashboard"])
    async def overview_api() -> dict[str, Any]:
        """Counts of the run: rollouts by status and mode, LLM calls by attribution, model versions; and the engines
        the proxy routes over, with their use."""
        counts = await run_in_threadpool(queries.overview, store_path)
        return {**counts, "engines": server.proxy.engines.usage()}

    @app.get("/ui/api/curve", tags=["dashboard"])
    async def curve_api() -> dict[str, list[list[float]]]:
        """The learning curve from the trainer's metrics.jsonl: [step, value] points per series."""
        return await run_in_threadpool(run_files.curve, run_dir)

    @app.get("/ui/api/rollouts", tags=["dashboard"])
    async def rollouts_api(
        status: str | None = None,
        mode: str | None = None,
        step: str | None = None,
        agent: str | None = None,
        min_reward: str | None = None,
        max_reward: str | None = None,
        after: str | None = None,
        size: int = Query(queries.PAGE_SIZE, ge=1, le=500),
    ) -> Response:
        """One page of the rollouts table (newest first) and the cursor of the next page."""
        try:
            flt = _filter(status, mode, step, agent, min_reward, max_reward)
            page = await run_in_threadpool(queries.rollouts_page, store_path, flt, after=after or None, size=size)
        except ValueError as exc:
            return JSONResponse(error_body(str(exc), "invalid_request_error"), status_code=400)
        rows = [vars(r) for r in page.rows]
        return JSONResponse({"rows": rows, "total": page.total, "next": page.next_cursor})


def _filter(
    status: str | None,
    mode: str | None,
    step: str | None,
    agent: str | None,
    min_reward: str | None,
    max_reward: str | None,
) -> queries.RolloutFilter:
    """Form values (empty means any) as a filter; a value that is not a number where one is needed: ValueError."""

    return queries.RolloutFilter(
        status=status or None,
        mode=mode or None,
        step=queries.parse_int64("step", step) if step else None,
        agent=agent or None,
        min_reward=queries.parse_float("min_reward", min_reward) if min_reward else None,
        max_reward=queries.parse_float("max_reward", max_reward) if max_reward else None,
    )
