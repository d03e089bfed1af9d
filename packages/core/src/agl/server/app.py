"""`agl serve`: one process holding the store's REST API, the OTLP/HTTP traces receiver and the LLM proxy."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import re
import signal
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response, StreamingResponse

from agl._version import __version__
from agl.schema import (
    INT64_MAX,
    Attempt,
    Claim,
    ClaimRequest,
    CompleteRequest,
    DetailsRequest,
    EnqueueRequest,
    HeartbeatRequest,
    ModelVersion,
    ModelVersionIn,
    RewardIn,
    RewardSource,
    Rollout,
    RolloutDetail,
    RolloutStatus,
    SpanBatch,
    SpanIn,
    Task,
    TaskIn,
)
from agl.server.connections import ConnectionLimits, guarded_protocol
from agl.server.credentials import attempt_credential
from agl.server.errors import describe_validation, document_errors, error_response, unknown_llm_route
from agl.server.fixed_url import FixedUrlMiddleware
from agl.server.middleware import (
    HEALTH_PATH,
    BearerTokenMiddleware,
    BodySizeLimitMiddleware,
    BrowserGuardMiddleware,
    DashboardHeadersMiddleware,
    Inflated,
    inflate,
)
from agl.server.otlp import DEFAULT_MAX_SPANS, TooManySpans, otlp_success_response, parse_otlp_traces
from agl.server.proxy import LLMProxy, UpstreamConfig, hung_up
from agl.store import ConflictError, NotFoundError, Store, StoreUnavailable
from agl.tracing import attributes as attr
from agl.trainable_wire import encode as encode_trainable

log = logging.getLogger(__name__)
T = TypeVar("T")
API = "/api/v1"


@dataclass
class ServerSettings:
    run_dir: Path
    host: str = "127.0.0.1"
    port: int = 8765
    token: str | None = None
    upstream: UpstreamConfig = field(default_factory=lambda: UpstreamConfig(base_url=None))
    served_model: str = "agl-policy"
    max_body_bytes: int = 32 * 1024 * 1024
    sweep_interval_s: float = 1.0
    # Host names the server answers to besides localhost, loopback addresses and the bound address
    allowed_hosts: tuple[str, ...] = ()
    # how long /healthz waits for a write to go through before it answers 503
    health_timeout_s: float = 5.0
    # spans one OTLP export request may hold (413 past it)
    max_spans_per_request: int = DEFAULT_MAX_SPANS
    # what a connection may cost before its request reaches the app (agl.server.connections)
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)


_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def allowed_host_names(settings: ServerSettings) -> frozenset[str] | None:
    """The Host names requests may carry; None: any (a wildcard bind, which requires a token, with no names)."""
    extra = {h.strip().lower().strip("[]") for h in settings.allowed_hosts if h.strip()}
    bound = settings.host.strip("[]").lower()
    wildcard = bound in ("0.0.0.0", "::", "")
    if wildcard and not extra:
        return None
    return frozenset(_LOOPBACK_NAMES | extra | (set() if wildcard else {bound}))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(settings: ServerSettings) -> None:
    """Refuse to expose the server beyond this machine without a token."""
    if not is_loopback(settings.host) and not settings.token:
        raise ValueError(
            f"binding to {settings.host} exposes the server beyond this machine: give a token with --token or"
            " AGL_TOKEN (every request must then carry 'Authorization: Bearer <token>')"
        )


def _only_own(request: Request, items: Sequence[SpanIn | RewardIn], what: str) -> None:
    """With an attempt's credential, only that attempt's own spans and rewards may be reported."""
    attempt = request.scope.get("agl.attempt")
    if attempt is None:
        return
    others = {item.attempt_id for item in items if item.attempt_id != attempt}
    if others:
        shown = ", ".join(sorted(str(o) for o in others)[:3])
        raise PermissionError(f"this credential belongs to attempt {attempt}: it cannot report {what} of {shown}")


_CHAT_PATH = re.compile(r"^/rollout/([^/]+)/attempt/([^/]+)/v1/chat/completions/?$")


class ProxyFastPath:
    """Sends chat completions straight to the proxy, past FastAPI's routing, dependency solving and middleware
    stack, which cost about a third of the proxy's CPU per call. The FastAPI route stays, for the OpenAPI
    document; the guards (token, body size) sit in front of this, so they still apply."""

    def __init__(self, app: Any, proxy: LLMProxy) -> None:
        self.app = app
        self.proxy = proxy

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            match = _CHAT_PATH.match(scope["path"])
            if match is not None:
                response = await self.proxy.chat_completions(Request(scope, receive), match[1], match[2])
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class Server:
    """The app and its state; `build_app()` returns the ASGI app with the guards in front."""

    def __init__(
        self,
        settings: ServerSettings,
        store: Store | None = None,
        on_fatal: Callable[[BaseException], None] | None = None,
    ) -> None:
        check_bind(settings)
        self.settings = settings
        self.on_fatal = on_fatal
        self.store = store or Store(settings.run_dir, on_writer_death=self._writer_died)
        if store is not None and store.writer.on_death is None:
            store.writer.on_death = self._writer_died
        self.proxy = LLMProxy(self.store, settings.upstream, settings.served_model)
        self._work_event: asyncio.Event | None = None
        self.app = self._build_fastapi()

    # ---------------------------------------------------------------------------------- helpers

    def _writer_died(self, exc: BaseException) -> None:
        """Called from the writer's thread as it ends: every write would fail from now on, so the server says so
        loudly and stops (health answers 503 meanwhile) rather than answering reads while refusing all work."""
        log.critical("agl serve cannot write to its store any more (%s: %s): stopping", type(exc).__name__, exc)
        if self.on_fatal is not None:
            self.on_fatal(exc)

    async def health(self) -> tuple[int, dict[str, Any]]:
        """(status, body) of `/healthz`: 200 once a write has gone through the writer, 503 if none can."""
        started = time.monotonic()
        try:
            await asyncio.wait_for(self._await(self.store.ping()), self.settings.health_timeout_s)
        except asyncio.TimeoutError:
            why = f"the store took no write within {self.settings.health_timeout_s:g} s"
            return 503, {"status": "unavailable", "store": why}
        except Exception as exc:
            return 503, {"status": "unavailable", "store": f"{type(exc).__name__}: {exc}"}
        return 200, {"status": "ok", "store": "writable", "write_ms": round((time.monotonic() - started) * 1e3, 2)}

    async def _await(self, fut: Future[T]) -> T:
        return await asyncio.wrap_future(fut)

    def _wake_workers(self) -> None:
        if self._work_event is not None:
            self._work_event.set()
            self._work_event = asyncio.Event()

    async def _sweep_forever(self) -> None:
        while True:
            try:
                if await self._await(self.store.expire_leases()):
                    self._wake_workers()
            except Exception:
                log.exception("lease sweep failed")
            await asyncio.sleep(self.settings.sweep_interval_s)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        self._work_event = asyncio.Event()
        sweeper = asyncio.create_task(self._sweep_forever())
        try:
            yield
        finally:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
            await self.proxy.aclose()
            await asyncio.to_thread(self.store.close)

    def build_app(self) -> Any:
        app: Any = ProxyFastPath(self.app, self.proxy)
        app = DashboardHeadersMiddleware(app)
        app = BodySizeLimitMiddleware(app, self.settings.max_body_bytes)
        app = BrowserGuardMiddleware(app, allowed_host_names(self.settings))
        if self.settings.token:  # without the token nothing else is revealed
            app = BearerTokenMiddleware(app, self.settings.token)
        # outermost: a call at the run's fixed LLM URL becomes its per-rollout call before any guard judges it
        return FixedUrlMiddleware(app)

    # ----------------------------------------------------------------------------------- routes

    def _build_fastapi(self) -> FastAPI:
        app = FastAPI(
            title="agl server",
            version=__version__,
            lifespan=self._lifespan,
            description="Store REST API, OTLP/HTTP traces receiver and token-exact LLM proxy of agl.",
        )
        store = self.store

        @app.exception_handler(RequestValidationError)
        async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
            return error_response(422, describe_validation(exc), "invalid_request_error")

        @app.exception_handler(NotFoundError)
        async def _not_found(_: Request, exc: NotFoundError) -> JSONResponse:
            return error_response(404, str(exc), "not_found")

        @app.exception_handler(StoreUnavailable)
        async def _unavailable(_: Request, exc: StoreUnavailable) -> JSONResponse:
            return error_response(503, str(exc), "server_error")

        @app.exception_handler(ConflictError)
        async def _conflict(_: Request, exc: ConflictError) -> JSONResponse:
            return error_response(409, str(exc), "conflict")

        @app.exception_handler(ValueError)
        async def _value(_: Request, exc: ValueError) -> JSONResponse:
            return error_response(400, str(exc), "invalid_request_error")

        @app.exception_handler(PermissionError)
        async def _forbidden(_: Request, exc: PermissionError) -> JSONResponse:
            return error_response(403, str(exc), "permission_error")

        @app.api_route(HEALTH_PATH, methods=["GET", "HEAD"], tags=["server"])
        async def healthz() -> JSONResponse:
            """Whether the server can do its work: 200 when a write reaches the store now, else 503 with why.
            Open without the token (it tells nothing else), for load balancers and supervisors."""
            status, body = await self.health()
            return JSONResponse(body, status_code=status)

        @app.get(f"{API}/info", tags=["server"])
        async def info() -> dict[str, Any]:
            return {
                "version": __version__,
                "store_writable": self.store.writer.alive,
                "served_model": self.settings.served_model,
                "upstream": self.settings.upstream.base_url,
                "auth": bool(self.settings.token),
                "model_version": self.proxy.model_version.version if self.proxy.model_version else None,
            }

        @app.get(f"{API}/stats", tags=["server"])
        async def stats() -> dict[str, Any]:
            counts, statuses = await run_in_threadpool(lambda: (store.counts(), store.status_counts()))
            return {"counts": counts, "rollouts_by_status": statuses}

        @app.post(f"{API}/tasks", tags=["tasks"], status_code=201)
        async def add_task(task: TaskIn) -> Task:
            return await self._await(store.add_task(task))

        @app.get(f"{API}/tasks/{{task_id}}", tags=["tasks"])
        async def get_task(task_id: str) -> Task:
            return await run_in_threadpool(store.get_task, task_id)

        @app.post(f"{API}/rollouts", tags=["rollouts"], status_code=201)
        async def enqueue(req: EnqueueRequest) -> list[Rollout]:
            rollouts = await self._await(store.enqueue(req))
            self._wake_workers()
            return rollouts

        @app.get(f"{API}/rollouts", tags=["rollouts"])
        async def list_rollouts(
            status: RolloutStatus | None = None,
            step: int | None = Query(default=None, ge=0, le=INT64_MAX),
            ids: str | None = Query(default=None, description="comma-separated rollout ids", max_length=100_000),
            limit: int = Query(default=100, ge=1, le=10_000),
            offset: int = Query(default=0, ge=0, le=INT64_MAX),
        ) -> dict[str, Any]:
            if ids is not None:
                wanted = [i for i in ids.split(",") if i]
                items = await run_in_threadpool(store.get_rollouts, wanted)
                return {"items": items, "total": len(items)}
            items, total = await run_in_threadpool(
                lambda: store.list_rollouts(
                    status=status.value if status else None, step=step, limit=limit, offset=offset
                )
            )
            return {"items": items, "total": total}

        @app.get(f"{API}/rollouts/{{rollout_id}}", tags=["rollouts"])
        async def get_rollout(rollout_id: str) -> Rollout:
            return await run_in_threadpool(store.get_rollout, rollout_id)

        @app.get(f"{API}/rollouts/{{rollout_id}}/detail", tags=["rollouts"])
        async def rollout_detail(rollout_id: str) -> RolloutDetail:
            return await run_in_threadpool(store.rollout_detail, rollout_id)

        @app.post(f"{API}/rollouts/details", tags=["rollouts"])
        async def rollout_details(req: DetailsRequest) -> list[RolloutDetail]:
            """Everything stored about many rollouts at once (the trainer's read); unknown ids are skipped."""
            return await run_in_threadpool(store.rollout_details, req.ids)

        @app.post(f"{API}/rollouts/trainable", tags=["rollouts"], response_class=Response)
        async def trainable_rollouts(req: DetailsRequest, request: Request) -> Response:
            """What training reads of many rollouts: each with the spans, LLM calls and rewards of its final
            attempt. Binary for a client whose `Accept` names `application/vnd.agl.trainable`, else JSON with
            token ids and log-probs as base64 of packed little-endian int32 / float64 (agl.trainable_wire)."""
            found = await run_in_threadpool(store.trainable_rollouts, req.ids)
            body, media_type = await run_in_threadpool(encode_trainable, found, request.headers.get("accept"))
            return Response(body, media_type=media_type)

        @app.post(f"{API}/rollouts/{{rollout_id}}/cancel", tags=["rollouts"])
        async def cancel(rollout_id: str) -> Rollout:
            return await self._await(store.cancel(rollout_id))

        @app.post(f"{API}/claims", tags=["workers"])
        async def claim(req: ClaimRequest, request: Request) -> list[Claim]:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + req.wait_s
            # A worker that dies during its long poll must not be handed the next rollout: it would burn an
            # attempt and hold the rollout until the lease ran out. The wait ends when the worker hangs up.
            hangup = asyncio.ensure_future(hung_up(request)) if req.wait_s > 0 else None
            try:
                while True:
                    event = self._work_event
                    claims = await self._await(store.claim(req.worker_id, req.max_rollouts, req.lease_s))
                    remaining = deadline - loop.time()
                    if claims or remaining <= 0 or event is None:
                        if self.settings.token:
                            secret = self.settings.token
                            claims = [
                                c.model_copy(update={"credential": attempt_credential(secret, c.attempt.id)})
                                for c in claims
                            ]
                        return claims
                    work = asyncio.ensure_future(event.wait())
                    waits = {work} if hangup is None else {work, hangup}
                    done, _ = await asyncio.wait(waits, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
                    work.cancel()
                    if hangup is not None and hangup in done:
                        log.info("worker %s hung up during its claim's wait: nothing claimed", req.worker_id)
                        return []
            finally:
                if hangup is not None:
                    hangup.cancel()

        @app.post(f"{API}/attempts/{{attempt_id}}/heartbeat", tags=["workers"])
        async def heartbeat(attempt_id: str, req: HeartbeatRequest) -> Attempt:
            return await self._await(store.heartbeat(attempt_id, req.lease_s))

        @app.post(f"{API}/attempts/{{attempt_id}}/complete", tags=["workers"])
        async def complete(attempt_id: str, req: CompleteRequest, response: Response) -> Rollout:
            rollout = await self._await(
                store.complete(
                    attempt_id,
                    req.status,
                    reward=req.reward,
                    error=req.error,
                    after_llm_seq=req.after_llm_seq,
                    agent_scopes=req.agent_scopes,
                    elsewhere=(
                        None
                        if req.bypassed_llm_calls is None
                        else (req.bypassed_llm_calls, req.bypassed_llm_url, req.external_llm_calls or 0)
                    ),
                )
            )
            if rollout.status is RolloutStatus.queued:
                self._wake_workers()
            if req.agent_scopes:
                # tells the runner, which warns its user once: the count is the store's, not a guess
                response.headers[attr.HEADER_MISSED_ATTRIBUTION] = str(store.missed_attribution(attempt_id))
            return rollout

        @app.post(f"{API}/spans", tags=["traces"])
        async def add_spans(batch: SpanBatch, request: Request) -> dict[str, int]:
            _only_own(request, batch.spans, "spans")
            unknown = await run_in_threadpool(store.unknown_rollouts, {s.rollout_id for s in batch.spans})
            if unknown:
                raise NotFoundError(f"spans name rollouts that do not exist: {', '.join(sorted(unknown)[:5])}")
            stored = await self._await(store.add_spans(batch.spans, reported=True))
            return {"received": len(batch.spans), "stored": stored}

        @app.post(f"{API}/rewards", tags=["traces"])
        async def add_rewards(rewards: list[RewardIn], request: Request) -> dict[str, int]:
            _only_own(request, rewards, "rewards")
            attempt = request.scope.get("agl.attempt")
            if attempt is not None and any(r.source is RewardSource.automatic for r in rewards):
                # AIR's rewards are the trainer's judgement of a trace, computed after the attempt; an agent that
                # could write them could grade itself (they are accepted even after its attempt ended)
                raise PermissionError(
                    f"this credential belongs to attempt {attempt}: automatic rewards come from the trainer only"
                )
            return {"stored": await self._await(store.add_rewards(rewards))}

        @app.post(f"{API}/model_versions", tags=["models"], status_code=201)
        async def publish(mv: ModelVersionIn) -> ModelVersion:
            version = await self._await(store.publish_model_version(mv))
            self.proxy.set_model_version(version)
            return version

        @app.get(f"{API}/model_versions/latest", tags=["models"])
        async def latest() -> ModelVersion | None:
            return self.proxy.model_version

        @app.get(f"{API}/proxy/usage", tags=["models"])
        async def proxy_usage() -> dict[str, Any]:
            """The upstream's use so far: calls in flight, seconds with at least one in flight (`busy_s`), calls
            answered and the tokens they generated, and whether new calls are held (the trainer's overlap figures)."""
            meter = self.proxy.meter
            return {
                "in_flight": meter.in_flight,
                "busy_s": meter.busy_s,
                "calls": meter.calls,
                "completion_tokens": meter.completion_tokens,
                "held": self.proxy.gate.held,
            }

        @app.post(f"{API}/proxy/hold", tags=["models"])
        async def hold_calls(
            drain_timeout_s: float = Query(default=600.0, gt=0, le=86_400),
            max_hold_s: float = Query(default=3600.0, gt=0, le=86_400),
        ) -> Any:
            """Hold new LLM calls and return once none is in flight (agl.server.call_gate): the trainer then
            changes weights in place and publishes between calls. Released by `/proxy/release`, or after
            `max_hold_s`. 409 when calls are still in flight after `drain_timeout_s` (the gate is open again)."""
            try:
                return await self.proxy.gate.hold(drain_timeout_s=drain_timeout_s, max_hold_s=max_hold_s)
            except TimeoutError as exc:
                return error_response(409, str(exc), "conflict")

        @app.post(f"{API}/proxy/release", tags=["models"])
        async def release_calls() -> dict[str, bool]:
            self.proxy.gate.release()
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
                limit = self.settings.max_body_bytes
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
                    parse_otlp_traces, body, content_type, self.settings.max_spans_per_request
                )
            except TooManySpans as exc:
                return error_response(413, str(exc), "invalid_request_error")
            _only_own(request, spans, "spans")
            unknown = await run_in_threadpool(store.unknown_rollouts, {s.rollout_id for s in spans})
            if unknown:
                raise NotFoundError(f"spans name rollouts that do not exist: {', '.join(sorted(unknown)[:5])}")
            if spans:
                await self._await(store.add_spans(spans, reported=True))
            payload, media = otlp_success_response(content_type)
            return Response(payload, media_type=media)

        @app.post("/rollout/{rollout_id}/attempt/{attempt_id}/v1/chat/completions", tags=["llm proxy"])
        async def chat(rollout_id: str, attempt_id: str, request: Request) -> Response:
            return await self.proxy.chat_completions(request, rollout_id, attempt_id)

        @app.post("/rollout/{rollout_id}/attempt/{attempt_id}/v1/responses", tags=["llm proxy"])
        async def responses(rollout_id: str, attempt_id: str, request: Request) -> Response:
            return await self.proxy.responses(request, rollout_id, attempt_id)

        @app.get("/rollout/{rollout_id}/attempt/{attempt_id}/v1/models", tags=["llm proxy"])
        async def rollout_models(rollout_id: str, attempt_id: str) -> Response:
            return self.proxy.models_response()

        @app.get("/v1/models", tags=["llm proxy"])
        async def models() -> Response:
            return self.proxy.models_response()

        # Any other OpenAI route (embeddings, completions, ...) gets a 404 that says what the proxy serves, not
        # FastAPI's bare {"detail": "Not Found"}, which an OpenAI client shows without a hint.
        @app.api_route(
            "/rollout/{rollout_id}/attempt/{attempt_id}/v1/{rest:path}", methods=_ANY_METHOD, include_in_schema=False
        )
        async def unknown_rollout_route(rollout_id: str, attempt_id: str, rest: str, request: Request) -> Response:
            return unknown_llm_route(request)

        @app.api_route("/v1/{rest:path}", methods=_ANY_METHOD, include_in_schema=False)
        async def unknown_fixed_route(rest: str, request: Request) -> Response:
            return unknown_llm_route(request)

        from agl.server import dashboard

        dashboard.add_routes(app, self)
        document_errors(app)
        return app


_ANY_METHOD = ["GET", "POST", "PUT", "PATCH", "DELETE"]


def create_app(settings: ServerSettings, store: Store | None = None) -> Any:
    """The ASGI app of `agl serve` (guards included)."""
    return Server(settings, store).build_app()


def serve(
    settings: ServerSettings, *, log_level: str = "warning", on_ready: Callable[[str], None] | None = None
) -> None:
    """Run the server in this process until interrupted; `on_ready` gets its URL once it is listening."""
    from agl import asgi

    fatal: list[BaseException] = []

    def stop_on_fatal(exc: BaseException) -> None:
        fatal.append(exc)
        os.kill(os.getpid(), signal.SIGTERM)  # uvicorn's own shutdown: open requests end, the store closes

    lock = lock_run_dir(settings.run_dir)  # held until this process exits
    try:
        app = Server(settings, on_fatal=stop_on_fatal).build_app()
        sock = asgi.bind(settings.host, settings.port)  # connections wait in the backlog from here on
        if on_ready is not None:
            on_ready(asgi.url_of(sock))
        asgi.serve(app, sock, log_level=log_level, http=guarded_protocol(settings.connections))
    finally:
        lock.close()
    if fatal:
        exc = fatal[0]
        raise SystemExit(f"agl serve stopped: its store could not take writes ({type(exc).__name__}: {exc})")


def lock_run_dir(run_dir: Path) -> Any:
    """Take the run directory for this server alone: two servers writing one store would hand out the same
    LLM sequence numbers and leases. The lock dies with the process (no stale lock after a crash)."""
    import fcntl
    import os

    run_dir.mkdir(parents=True, exist_ok=True)
    handle = open(run_dir / "agl.lock", "a+")  # noqa: SIM115 (kept open for the server's life)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise ValueError(
            f"{run_dir} is in use by another agl serve ({holder}): stop it, or give this one another --run-dir"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}")
    handle.flush()
    return handle
