"""`agl serve`: one process holding the store's REST API, the OTLP/HTTP traces receiver and the LLM proxy.

Here: the settings, the server's state and lifespan, the guards in front of the app, and the process. The routes
are added by one module per group: routes_server (health, info, stats), routes_rollouts (tasks, rollouts, what
workers do), routes_traces (spans, rewards, OTLP), routes_training (model versions, the proxy's hold and usage,
the export), routes_llm (the LLM proxy), and the dashboard.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response

from agl._version import __version__
from agl.server import routes_llm, routes_rollouts, routes_server, routes_traces, routes_training
from agl.server.connections import guarded_protocol
from agl.server.errors import (
    allowed_methods,
    describe_validation,
    document_errors,
    error_response,
    method_not_allowed,
    takes_post,
)
from agl.server.fixed_url import FixedUrlMiddleware, FixedUrlRefusal
from agl.server.middleware import (
    BearerTokenMiddleware,
    BodySizeLimitMiddleware,
    BrowserGuardMiddleware,
    DashboardHeadersMiddleware,
    SpanBodyGuard,
)
from agl.server.proxy import LLMProxy
from agl.server.routes_llm import ProxyFastPath
from agl.server.settings import ServerSettings
from agl.store import ConflictError, NotFoundError, Store, StoreUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")
HEALTH_REUSE_S = 1.0  # how long a probe write that went through stands for the store being writable


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
        self.work_event: asyncio.Event | None = None
        self._health_probe: asyncio.Future[tuple[int, dict[str, Any]]] | None = None
        self._health_ok: tuple[float, dict[str, Any]] | None = None  # (when, body) of the last probe that wrote
        self.app = self._build_fastapi()

    # ---------------------------------------------------------------------------------- helpers

    def _writer_died(self, exc: BaseException) -> None:
        """Called from the writer's thread as it ends: every write would fail from now on, so the server says so
        loudly and stops (health answers 503 meanwhile) rather than answering reads while refusing all work."""
        log.critical("agl serve cannot write to its store any more (%s: %s): stopping", type(exc).__name__, exc)
        if self.on_fatal is not None:
            self.on_fatal(exc)

    async def health(self) -> tuple[int, dict[str, Any]]:
        """(status, body) of `/healthz`: 200 once a write has gone through the writer, 503 if none can.

        One probe write at a time, and a success stands for `HEALTH_REUSE_S` (its age in the answer): a flood of
        health checks made the operator's own writes 20× slower when each one wrote (issue #41, N17). A writer
        that has died is seen at once, whatever the last probe said."""
        if not self.store.writer.alive:
            return 503, {"status": "unavailable", "store": "the store's writer has stopped"}
        last = self._health_ok
        if last is not None and time.monotonic() - last[0] < HEALTH_REUSE_S:
            return 200, {**last[1], "checked_s_ago": round(time.monotonic() - last[0], 3)}
        if self._health_probe is None or self._health_probe.done():
            self._health_probe = asyncio.ensure_future(self._probe_health())
        return await asyncio.shield(self._health_probe)  # a caller that leaves does not cancel the others' probe

    async def _probe_health(self) -> tuple[int, dict[str, Any]]:
        started = time.monotonic()
        try:
            await asyncio.wait_for(self.written(self.store.ping()), self.settings.health_timeout_s)
        except asyncio.TimeoutError:
            why = f"the store took no write within {self.settings.health_timeout_s:g} s"
            return 503, {"status": "unavailable", "store": why}
        except Exception as exc:
            return 503, {"status": "unavailable", "store": f"{type(exc).__name__}: {exc}"}
        write_ms = round((time.monotonic() - started) * 1e3, 2)
        body = {"status": "ok", "store": "writable", "write_ms": write_ms, "checked_at": round(time.time(), 6)}
        self._health_ok = (time.monotonic(), body)
        return 200, {**body, "checked_s_ago": 0.0}

    async def written(self, fut: Future[T]) -> T:
        """The store writer's answer to a write, awaited without blocking the event loop."""
        return await asyncio.wrap_future(fut)

    def wake_workers(self) -> None:
        """End the long polls of workers waiting for a claim: there may be work now (`work_event` is the one they
        wait on, replaced each time)."""
        if self.work_event is not None:
            self.work_event.set()
            self.work_event = asyncio.Event()

    async def _sweep_forever(self) -> None:
        while True:
            try:
                if await self.written(self.store.expire_leases()):
                    self.wake_workers()
            except Exception:
                log.exception("lease sweep failed")
            await asyncio.sleep(self.settings.sweep_interval_s)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        self.work_event = asyncio.Event()
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
        app: Any = FixedUrlRefusal(ProxyFastPath(self.app, self.proxy))
        app = SpanBodyGuard(app, f"{routes_server.API}/spans", self.settings.max_spans_per_request)
        app = DashboardHeadersMiddleware(app)
        app = BodySizeLimitMiddleware(app, self.settings.max_body_bytes)
        app = BrowserGuardMiddleware(app, allowed_host_names(self.settings), takes_post(self.app))
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

        @app.exception_handler(StarletteHTTPException)
        async def _http(request: Request, exc: StarletteHTTPException) -> Response:
            if exc.status_code == 405:
                return method_not_allowed(request, allowed_methods(app, request.scope))
            return await http_exception_handler(request, exc)

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

        # In this order: the OpenAPI document lists the routes as they are added, and the LLM proxy's catch-all
        # `/v1/...` routes must come after `/v1/traces`.
        routes_server.add_routes(app, self)
        routes_rollouts.add_routes(app, self)
        routes_traces.add_routes(app, self)
        routes_training.add_routes(app, self)
        routes_traces.add_otlp_route(app, self)
        routes_llm.add_routes(app, self)

        from agl.server import dashboard

        dashboard.add_routes(app, self)
        document_errors(app)
        return app


def create_app(settings: ServerSettings, store: Store | None = None) -> Any:
    """The ASGI app of `agl serve` (guards included)."""
    return Server(settings, store).build_app()


def serve(
    settings: ServerSettings, *, log_level: str = "warning", on_ready: Callable[[str], None] | None = None
) -> None:
    """Run the server in this process until interrupted; `on_ready` gets its URL once it is listening."""
    from agl.common import asgi

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
