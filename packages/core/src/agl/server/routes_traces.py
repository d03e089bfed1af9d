"""What rollouts report: spans and rewards through the REST API, and spans as OTLP/HTTP traces (protobuf or
JSON). With an attempt's credential, a caller reports only its own attempt's spans and rewards."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from agl.schema import RewardIn, RewardSource, SpanBatch, SpanIn
from agl.server.errors import error_response
from agl.server.middleware import Inflated, inflate
from agl.server.otlp import otlp_success_response, parse_otlp_traces
from agl.server.reward_range import check_rewards
from agl.server.routes_server import API
from agl.server.span_caps import TooManySpans
from agl.store import NotFoundError

if TYPE_CHECKING:
    from agl.server.context import ServerContext


def _only_own(request: Request, items: Sequence[SpanIn | RewardIn], what: str) -> None:
    """With an attempt's credential, only that attempt's own spans and rewards may be reported."""
    attempt = request.scope.get("agl.attempt")
    if attempt is None:
        return
    others = {item.attempt_id for item in items if item.attempt_id != attempt}
    if others:
        shown = ", ".join(sorted(str(o) for o in others)[:3])
        raise PermissionError(f"this credential belongs to attempt {attempt}: it cannot report {what} of {shown}")


def add_routes(app: FastAPI, server: ServerContext) -> None:
    """`POST /api/v1/spans` and `POST /api/v1/rewards`."""
    store = server.store

    @app.post(f"{API}/spans", tags=["traces"])
    async def add_spans(batch: SpanBatch, request: Request) -> dict[str, int]:
        _only_own(request, batch.spans, "spans")
        unknown = await run_in_threadpool(store.unknown_rollouts, {s.rollout_id for s in batch.spans})
        if unknown:
            raise NotFoundError(f"spans name rollouts that do not exist: {', '.join(sorted(unknown)[:5])}")
        stored = await server.written(store.add_spans(batch.spans, reported=True))
        return {"received": len(batch.spans), "stored": stored}

    @app.post(f"{API}/rewards", tags=["traces"])
    async def add_rewards(rewards: list[RewardIn], request: Request) -> dict[str, int]:
        _only_own(request, rewards, "rewards")
        check_rewards(((f"reward {r.name!r}", r.value) for r in rewards), server.settings.max_abs_reward)
        attempt = request.scope.get("agl.attempt")
        if attempt is not None and any(r.source is RewardSource.automatic for r in rewards):
            # AIR's rewards are the trainer's judgement of a trace, computed after the attempt; an agent that
            # could write them could grade itself (they are accepted even after its attempt ended)
            raise PermissionError(
                f"this credential belongs to attempt {attempt}: automatic rewards come from the trainer only"
            )
        return {"stored": await server.written(store.add_rewards(rewards))}


def add_otlp_route(app: FastAPI, server: ServerContext) -> None:
    """`POST /v1/traces`, the OTLP/HTTP receiver: registered before the LLM proxy's catch-all `/v1/...` route."""
    store = server.store

    @app.post("/v1/traces", tags=["traces"], summary="OTLP/HTTP traces receiver (protobuf or JSON)")
    async def otlp_traces(request: Request) -> Response:
        # no default: a body without a content type is what a cross-site page can send (the guard refuses it)
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type not in ("application/x-protobuf", "application/json"):
            return error_response(
                415,
                f"unsupported content type {content_type!r}: send application/x-protobuf or application/json",
                "invalid_request_error",
            )
        body = await request.body()
        encoding = request.headers.get("content-encoding", "").strip().lower()
        if encoding not in ("", "identity"):
            limit = server.settings.max_body_bytes
            try:
                body = await run_in_threadpool(inflate, body, encoding, limit)
            except Inflated:
                return error_response(
                    413,
                    f"the {encoding} body inflates past the limit of {limit} bytes (agl serve --max-body-mb)",
                    "invalid_request_error",
                )
        # decoded in a worker thread: 100,000 spans froze the event loop, and with it every proxied call, for 2 s
        try:
            spans = await run_in_threadpool(
                parse_otlp_traces, body, content_type, server.settings.max_spans_per_request
            )
        except TooManySpans as exc:
            return error_response(413, str(exc), "invalid_request_error")
        _only_own(request, spans, "spans")
        unknown = await run_in_threadpool(store.unknown_rollouts, {s.rollout_id for s in spans})
        if unknown:
            raise NotFoundError(f"spans name rollouts that do not exist: {', '.join(sorted(unknown)[:5])}")
        if spans:
            await server.written(store.add_spans(spans, reported=True))
        payload, media = otlp_success_response(content_type)
        return Response(payload, media_type=media)
