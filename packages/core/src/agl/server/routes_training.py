"""What the trainer drives: model versions (publishing one routes the proxy's next calls to it), the proxy's use
of its upstream and the hold on new calls around an update, and the export of the stored LLM calls."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import FastAPI, Query, Request
from starlette.responses import Response, StreamingResponse

from agl.schema import INT64_MAX, EngineIn, ModelVersion, ModelVersionIn
from agl.server.engine_admission import EngineRefused, admitted_url, check_operator
from agl.server.errors import error_response
from agl.server.relay import hung_up
from agl.server.routes_server import API
from agl.store import NotFoundError

if TYPE_CHECKING:
    from agl.server.context import ServerContext


def add_routes(app: FastAPI, server: ServerContext) -> None:
    store, proxy = server.store, server.proxy

    @app.post(f"{API}/model_versions", tags=["models"], status_code=201)
    async def publish(mv: ModelVersionIn) -> ModelVersion:
        version = await server.written(store.publish_model_version(mv))
        proxy.set_model_version(version)
        return version

    @app.get(f"{API}/model_versions/latest", tags=["models"])
    async def latest() -> ModelVersion | None:
        return proxy.model_version

    @app.get(f"{API}/proxy/usage", tags=["models"])
    async def proxy_usage() -> dict[str, Any]:
        """The upstream's use so far: calls in flight, seconds with at least one in flight (`busy_s`), calls
        answered and the tokens they generated, and whether new calls are held (the trainer's overlap figures)."""
        meter = proxy.meter
        return {
            "in_flight": meter.in_flight,
            "busy_s": meter.busy_s,
            "calls": meter.calls,
            "completion_tokens": meter.completion_tokens,
            "held": proxy.gate.held,
            "engines": proxy.engines.usage(),  # the same figures per engine, and whether it is in rotation
        }

    @app.get(f"{API}/proxy/engines", tags=["models"])
    async def engines() -> list[dict[str, Any]]:
        """The engines the proxy routes calls over (agl.server.engines), each with its use so far."""
        return proxy.engines.usage()

    @app.post(f"{API}/proxy/engines", tags=["models"], status_code=201)
    async def add_engine(engine: EngineIn, request: Request) -> Any:
        """Put an engine in rotation (the trainer, as it starts a server); one already known is put back in. Needs
        the operator's or the admin token; the URL is checked (agl.server.engine_admission)."""
        try:
            check_operator(request, server.settings)
            url = await admitted_url(engine.url, request, server.settings, proxy)
        except EngineRefused as exc:
            return error_response(
                exc.status, str(exc), "permission_error" if exc.status == 403 else "invalid_request_error"
            )
        known = proxy.engines.engines.get(url)
        proxy.engines.add(
            url, gets_api_key=server.settings.api_key_to_added_engines if known is None else known.gets_api_key
        )
        return proxy.engines.usage()

    @app.post(f"{API}/proxy/engines/remove", tags=["models"])
    async def remove_engine(engine: EngineIn, request: Request) -> Any:
        """Take an engine out of rotation for good (its calls in flight go on); 404 when it is not known."""
        try:
            check_operator(request, server.settings)
        except EngineRefused as exc:
            return error_response(exc.status, str(exc), "permission_error")
        if not proxy.engines.remove(engine.url):
            raise NotFoundError(f"no engine {engine.url!r}: the proxy routes over {proxy.engines.usage()}")
        return proxy.engines.usage()

    @app.post(f"{API}/proxy/hold", tags=["models"])
    async def hold_calls(
        request: Request,
        drain_timeout_s: float = Query(default=600.0, gt=0, le=86_400),
        max_hold_s: float = Query(default=3600.0, gt=0, le=86_400),
    ) -> Any:
        """Hold new LLM calls and return once none is in flight (agl.server.call_gate): the trainer then
        changes weights in place and publishes between calls. Released by `/proxy/release`, or after
        `max_hold_s` (holding again while held renews it). 409 when calls are still in flight after
        `drain_timeout_s` or the server's `--hold-drain-timeout`, whichever is shorter (the gate is open again);
        a caller that hangs up while the calls drain releases the hold."""
        hold = asyncio.ensure_future(
            proxy.gate.hold(
                drain_timeout_s=drain_timeout_s, max_hold_s=max_hold_s, max_drain_s=server.settings.hold_drain_max_s
            )
        )
        gone = asyncio.ensure_future(hung_up(request))
        try:
            await asyncio.wait((hold, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not hold.done():
            hold.cancel()  # the gate opens again: nobody is there to release it
            with contextlib.suppress(BaseException):
                await hold
            return Response(status_code=499)
        try:
            return hold.result()
        except TimeoutError as exc:
            return error_response(409, str(exc), "conflict")

    @app.post(f"{API}/proxy/release", tags=["models"])
    async def release_calls() -> dict[str, bool]:
        proxy.gate.release()
        return {"held": False}

    @app.get(f"{API}/export/llm_calls", tags=["export"], response_class=StreamingResponse)
    async def export(
        step: int | None = Query(default=None, ge=0, le=INT64_MAX), trainable_only: bool = True
    ) -> StreamingResponse:
        def lines() -> Any:
            for rollout, call in store.iter_final_llm_calls(step=step):
                if trainable_only and not call.trainable:
                    continue
                row = call.model_dump(mode="json")
                row["task_id"], row["final_reward"] = rollout.task_id, rollout.final_reward
                yield orjson.dumps(row) + b"\n"

        return StreamingResponse(lines(), media_type="application/x-ndjson")
