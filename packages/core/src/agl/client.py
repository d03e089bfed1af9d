"""HTTP clients for the store API of `agl serve`: `Client` (sync, for scripts, the CLI and the trainer) and
`AsyncClient` (for runners). Both raise `AglHTTPError` carrying the server's own message."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, TypeVar

import httpx
import orjson
from pydantic import BaseModel, TypeAdapter

from agl.common import attributes as attr
from agl.common.trainable import TrainableRollout
from agl.common.trainable_wire import BINARY_TYPE, JSON_TYPE
from agl.common.trainable_wire import decode as decode_trainable
from agl.schema import (
    Attempt,
    Claim,
    EnqueueRequest,
    ModelVersion,
    ModelVersionIn,
    RewardIn,
    Rollout,
    RolloutDetail,
    SpanIn,
    Task,
    TaskIn,
)

API = "/api/v1"
DEFAULT_SERVER = "http://127.0.0.1:8765"
M = TypeVar("M")

_claims = TypeAdapter(list[Claim])
_rollouts = TypeAdapter(list[Rollout])
_details = TypeAdapter(list[RolloutDetail])


class Completed(NamedTuple):
    """The server's answer to an attempt's report."""

    rollout: Rollout
    missed_attribution: int  # LLM calls of the attempt that lost their agent name (an unpatched HTTP client)
    # (agent, calls, one reason): its calls stored not trainable for how the agent sampled them (train rollouts)
    untrainable_sampling: tuple[tuple[str | None, int, str], ...] = ()


def _sampling_report(header: str | None) -> tuple[tuple[str | None, int, str], ...]:
    """The completion's `x-agl-untrainable-sampling`; what does not read as one is no report (a server's detail)."""
    try:
        found = orjson.loads(header) if header else []
        return tuple((None if a is None else str(a), int(n), str(why)) for a, n, why in found)
    except (ValueError, TypeError):
        return ()


class AglHTTPError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


class NotFound(AglHTTPError):
    pass


class Conflict(AglHTTPError):
    pass


def _raise_for(resp: httpx.Response) -> None:
    if resp.status_code < 400:
        return
    try:
        err = resp.json().get("error", {})
        message = err.get("message") if isinstance(err, dict) else str(err)
    except ValueError:
        message = resp.text[:500]
    cls = {404: NotFound, 409: Conflict}.get(resp.status_code, AglHTTPError)
    raise cls(resp.status_code, message or resp.reason_phrase)


def server_url_from_env(url: str | None = None) -> str:
    return (url or os.environ.get("AGL_SERVER_URL") or DEFAULT_SERVER).rstrip("/")


def _headers(token: str | None) -> dict[str, str]:
    token = token or os.environ.get("AGL_TOKEN")
    return {"authorization": f"Bearer {token}"} if token else {}


# what one POST /spans may hold when the server does not say (`info`'s max_spans_per_request and max_body_bytes: an
# older server): agl serve's defaults
_DEFAULT_SPAN_LIMITS = (10_000, 32 * 1024 * 1024)
_JSON_BODY = {"content-type": "application/json"}
# and a batch's bytes at most this, whatever the server takes: decoding a span body costs the server ~30 times its
# size, so a rollout's 40 MB of spans goes in several requests of a few MB, not in one of 32 MB
_SPAN_BATCH_BYTES = 4 * 1024 * 1024


def span_batch_limits(info: dict[str, Any]) -> tuple[int, int]:
    """(spans, bytes) one POST /spans body may hold, from the server's `info` (its defaults where it does not say)."""
    spans = info.get("max_spans_per_request")
    size = info.get("max_body_bytes")
    return (
        spans if isinstance(spans, int) and spans > 0 else _DEFAULT_SPAN_LIMITS[0],
        size if isinstance(size, int) and size > 0 else _DEFAULT_SPAN_LIMITS[1],
    )


def span_bodies(spans: Sequence[SpanIn], max_spans: int, max_bytes: int) -> Iterator[bytes]:
    """`{"spans": [...]}` bodies that hold all of `spans` in order, each within `max_spans` spans and
    min(`max_bytes`, 4 MiB) bytes: a rollout of 100,000 tool runs sent in one request was refused whole (413) and
    lost every span. A single span over the bytes goes alone (the server then says why it refuses it)."""
    budget = min(max_bytes, _SPAN_BATCH_BYTES) - 64  # the wrapper and a margin
    parts: list[bytes] = []
    size = 0
    for span in spans:
        encoded = orjson.dumps(span.model_dump(mode="json"))
        if parts and (len(parts) >= max_spans or size + len(encoded) + 1 > budget):
            yield b'{"spans":[' + b",".join(parts) + b"]}"
            parts, size = [], 0
        parts.append(encoded)
        size += len(encoded) + 1
    if parts:
        yield b'{"spans":[' + b",".join(parts) + b"]}"


def _json(model: BaseModel | Sequence[BaseModel] | dict[str, Any]) -> Any:
    if isinstance(model, BaseModel):
        return model.model_dump(mode="json", exclude_none=False)
    if isinstance(model, dict):
        return model
    return [m.model_dump(mode="json") for m in model]


class Client:
    """Blocking client of the store API."""

    def __init__(self, server_url: str | None = None, *, token: str | None = None, timeout: float = 60.0) -> None:
        self.server_url = server_url_from_env(server_url)
        self._http = httpx.Client(base_url=self.server_url, headers=_headers(token), timeout=timeout)
        self._span_limits: tuple[int, int] | None = None  # asked of the server once, at the first spans sent

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(
        self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None
    ) -> httpx.Response:
        resp = self._http.request(method, API + path, json=body, params=params)
        _raise_for(resp)
        return resp

    def _call(self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None) -> Any:
        return self._request(method, path, body, params).json()

    def info(self) -> dict[str, Any]:
        return dict(self._call("GET", "/info"))

    def stats(self) -> dict[str, Any]:
        return dict(self._call("GET", "/stats"))

    def add_task(self, task: TaskIn) -> Task:
        return Task.model_validate(self._call("POST", "/tasks", _json(task)))

    def enqueue(
        self, task: TaskIn | Any = None, *, task_id: str | None = None, n: int = 1, **options: Any
    ) -> list[Rollout]:
        """Enqueue `n` rollouts of a task: a `TaskIn`, any JSON task input (dict, string, ...), or, with `task_id`,
        a task already stored (a string is always an input, never read as an id)."""
        if task_id is not None:
            if task is not None:
                raise ValueError("give either a task or task_id, not both")
            req = EnqueueRequest(task_id=task_id, n=n, **options)
        else:
            req = EnqueueRequest(task=task if isinstance(task, TaskIn) else TaskIn(input=task), n=n, **options)
        return _rollouts.validate_python(self._call("POST", "/rollouts", _json(req)))

    def get_rollout(self, rollout_id: str) -> Rollout:
        return Rollout.model_validate(self._call("GET", f"/rollouts/{rollout_id}"))

    def get_rollouts(self, ids: Sequence[str]) -> list[Rollout]:
        out: list[Rollout] = []
        for start in range(0, len(ids), 200):
            chunk = ",".join(ids[start : start + 200])
            out += _rollouts.validate_python(self._call("GET", "/rollouts", params={"ids": chunk})["items"])
        return out

    def list_rollouts(
        self, *, status: str | None = None, step: int | None = None, limit: int = 100, offset: int = 0
    ) -> tuple[list[Rollout], int]:
        params = {
            k: v for k, v in {"status": status, "step": step, "limit": limit, "offset": offset}.items() if v is not None
        }
        page = self._call("GET", "/rollouts", params=params)
        return _rollouts.validate_python(page["items"]), int(page["total"])

    def rollout_detail(self, rollout_id: str) -> RolloutDetail:
        return RolloutDetail.model_validate(self._call("GET", f"/rollouts/{rollout_id}/detail"))

    def rollout_details(self, ids: Sequence[str]) -> list[RolloutDetail]:
        """Many rollouts' details in few requests (unknown ids are skipped)."""
        out: list[RolloutDetail] = []
        for start in range(0, len(ids), 1000):
            out += _details.validate_python(
                self._call("POST", "/rollouts/details", {"ids": list(ids[start : start + 1000])})
            )
        return out

    def trainable_rollouts(self, ids: Sequence[str]) -> list[TrainableRollout]:
        """What training reads of many rollouts (their final attempts, token ids packed; agl.common.trainable), in few
        requests; unknown ids are skipped."""
        out: list[TrainableRollout] = []
        for start in range(0, len(ids), 1000):
            resp = self._http.post(
                f"{API}/rollouts/trainable",
                json={"ids": list(ids[start : start + 1000])},
                headers={"accept": f"{BINARY_TYPE}, {JSON_TYPE};q=0.5"},
            )
            _raise_for(resp)
            out += decode_trainable(resp.content, resp.headers.get("content-type"))
        return out

    def cancel(self, rollout_id: str) -> Rollout:
        return Rollout.model_validate(self._call("POST", f"/rollouts/{rollout_id}/cancel", {}))

    def wait(self, ids: Sequence[str], *, timeout: float | None = None, poll_s: float = 0.2) -> list[Rollout]:
        """Block until every rollout is finished (succeeded, failed or cancelled)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            rollouts = self.get_rollouts(ids)
            if all(r.status.terminal for r in rollouts):
                return rollouts
            if deadline is not None and time.monotonic() > deadline:
                pending = sum(not r.status.terminal for r in rollouts)
                raise TimeoutError(f"{pending} of {len(ids)} rollouts still unfinished after {timeout} s")
            time.sleep(poll_s)

    def publish_model_version(self, mv: ModelVersionIn) -> ModelVersion:
        return ModelVersion.model_validate(self._call("POST", "/model_versions", _json(mv)))

    def proxy_usage(self) -> dict[str, Any]:
        """The proxy's upstream use so far: `in_flight`, `busy_s`, `calls`, `completion_tokens`, `held`."""
        return dict(self._call("GET", "/proxy/usage"))

    def engines(self) -> list[dict[str, Any]]:
        """The engines the proxy routes calls over, each with its use so far (agl.server.engines)."""
        return list(self._call("GET", "/proxy/engines"))

    def add_engine(self, url: str) -> list[dict[str, Any]]:
        """Put an engine (an OpenAI-compatible base URL ending in /v1) in the proxy's rotation."""
        return list(self._call("POST", "/proxy/engines", {"url": url}))

    def remove_engine(self, url: str) -> list[dict[str, Any]]:
        """Take an engine out of the proxy's rotation for good; its calls in flight go on."""
        return list(self._call("POST", "/proxy/engines/remove", {"url": url}))

    @contextlib.contextmanager
    def calls_held(self, *, drain_timeout_s: float = 600.0, max_hold_s: float = 60.0) -> Iterator[dict[str, Any]]:
        """Inside, no LLM call is in flight and new ones wait at the proxy (agl.server.call_gate): weights can
        change in place and a version be published between calls. Released on leaving, whatever happened.

        The server keeps new calls waiting for a drain only so long (its `--hold-drain-timeout`); a refused hold
        is tried again, the calls flowing in between, until `drain_timeout_s`. Inside, the hold is renewed every
        third of `max_hold_s`, so a trainer that dies releases the agents within `max_hold_s`."""
        deadline = time.monotonic() + drain_timeout_s
        left = drain_timeout_s
        while True:
            params = {"drain_timeout_s": left, "max_hold_s": max_hold_s}
            # the wait is the server's, bounded by its own drain limit and by what is left of drain_timeout_s
            resp = self._http.request("POST", API + "/proxy/hold", json={}, params=params, timeout=left + 30)
            if resp.status_code != 409 or time.monotonic() + 1.0 >= deadline:
                break
            time.sleep(0.5)  # the gate is open meanwhile: the calls that waited go through
            left = round(max(deadline - time.monotonic(), 0.1), 1)
        _raise_for(resp)
        held = dict(resp.json())
        stop = threading.Event()
        renew = threading.Thread(target=self._renew_hold, args=(stop, max_hold_s), daemon=True, name="agl-hold")
        renew.start()
        try:
            yield held
        finally:
            stop.set()
            renew.join()
            self._call("POST", "/proxy/release", {})

    def _renew_hold(self, stop: threading.Event, max_hold_s: float) -> None:
        # holding again while held drains nothing (no call is in flight) and pushes the lapse back
        while not stop.wait(max_hold_s / 3):
            with contextlib.suppress(httpx.HTTPError):
                params = {"drain_timeout_s": 1.0, "max_hold_s": max_hold_s}
                self._http.request("POST", API + "/proxy/hold", json={}, params=params, timeout=max_hold_s / 3)

    def add_spans(self, spans: Sequence[SpanIn]) -> int:
        """Store `spans`, in as many requests as the server's limits ask (`span_bodies`); the number stored. A
        batch sent again after a failure is stored once (the server keeps a span id once)."""
        if self._span_limits is None:
            info: dict[str, Any] = {}
            with contextlib.suppress(AglHTTPError):  # a credential that may not read it: the defaults
                info = self.info()
            self._span_limits = span_batch_limits(info)
        stored = 0
        for body in span_bodies(spans, *self._span_limits):
            resp = self._http.request("POST", API + "/spans", content=body, headers=_JSON_BODY)
            _raise_for(resp)
            stored += int(resp.json()["stored"])
        return stored

    def add_rewards(self, rewards: Sequence[RewardIn]) -> int:
        return int(self._call("POST", "/rewards", _json(rewards))["stored"])

    def export_llm_calls(self, *, step: int | None = None, trainable_only: bool = True) -> Iterator[str]:
        params: dict[str, Any] = {"trainable_only": trainable_only}
        if step is not None:
            params["step"] = step
        with self._http.stream("GET", API + "/export/llm_calls", params=params) as resp:
            if resp.status_code >= 400:
                resp.read()
                _raise_for(resp)
            yield from resp.iter_lines()


class AsyncClient:
    """Non-blocking client with the calls a runner makes."""

    def __init__(self, server_url: str | None = None, *, token: str | None = None, timeout: float = 60.0) -> None:
        self.server_url = server_url_from_env(server_url)
        self._http = httpx.AsyncClient(
            base_url=self.server_url,
            headers=_headers(token),
            timeout=timeout,
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
        )
        self._span_limits: tuple[int, int] | None = None  # asked of the server once, at the first spans sent

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> Any:
        kwargs: dict[str, Any] = {"json": body}
        if timeout is not None:
            kwargs["timeout"] = timeout
        resp = await self._http.request(method, API + path, **kwargs)
        _raise_for(resp)
        return resp.json()

    async def info(self) -> dict[str, Any]:
        return dict(await self._call("GET", "/info"))

    async def claim(self, worker_id: str, max_rollouts: int, *, lease_s: float, wait_s: float) -> list[Claim]:
        body = {"worker_id": worker_id, "max_rollouts": max_rollouts, "lease_s": lease_s, "wait_s": wait_s}
        return _claims.validate_python(await self._call("POST", "/claims", body, timeout=wait_s + 30))

    async def heartbeat(self, attempt_id: str, lease_s: float) -> Attempt:
        return Attempt.model_validate(
            await self._call("POST", f"/attempts/{attempt_id}/heartbeat", {"lease_s": lease_s})
        )

    async def complete(
        self,
        attempt_id: str,
        status: str,
        *,
        reward: float | None,
        error: str | None,
        after_llm_seq: int | None,
        agent_scopes: int | None = None,
        elsewhere: tuple[int, str | None, int, int | None, int | None] | tuple[int, str | None, int] | None = None,
    ) -> Completed:
        body = {
            "status": status,
            "reward": reward,
            "error": error,
            "after_llm_seq": after_llm_seq,
            "agent_scopes": agent_scopes,
        }
        if elsewhere is not None:  # LLM calls sent elsewhere than agl (agl.store.lifecycle.Elsewhere)
            keys = ("bypassed_llm_calls", "bypassed_llm_url", "external_llm_calls", "bypassed_llm_answered")
            body.update(zip((*keys, "bypassed_llm_refused"), elsewhere, strict=False))
        resp = await self._http.request("POST", f"{API}/attempts/{attempt_id}/complete", json=body)
        _raise_for(resp)
        missed = resp.headers.get(attr.HEADER_MISSED_ATTRIBUTION, "0")
        return Completed(
            Rollout.model_validate(resp.json()),
            int(missed) if missed.isdigit() else 0,
            _sampling_report(resp.headers.get(attr.HEADER_UNTRAINABLE_SAMPLING)),
        )

    async def add_spans(self, spans: Sequence[SpanIn]) -> int:
        """Store `spans`, in as many requests as the server's limits ask (`span_bodies`); the number stored. A
        batch sent again after a failure is stored once (the server keeps a span id once)."""
        if self._span_limits is None:
            info: dict[str, Any] = {}
            with contextlib.suppress(AglHTTPError):  # a credential that may not read it: the defaults
                info = await self.info()
            self._span_limits = span_batch_limits(info)
        stored = 0
        for body in span_bodies(spans, *self._span_limits):
            resp = await self._http.request("POST", API + "/spans", content=body, headers=_JSON_BODY)
            _raise_for(resp)
            stored += int(resp.json()["stored"])
        return stored

    async def add_rewards(self, rewards: Sequence[RewardIn]) -> int:
        return int((await self._call("POST", "/rewards", _json(rewards)))["stored"])
