"""The token-exact LLM proxy: forwards an agent's chat completion to the backend and stores the call.

The agent's request goes to the upstream with `return_token_ids` and `logprobs` added, so a vLLM-style
backend reports the exact ids it consumed and produced; the answer (a JSON body or an SSE stream) goes back
to the agent byte for byte. The call is queued for the store before the agent sees the end of the answer,
and the store commits in order, so by the time the agent reports its rollout finished, its calls are stored.
A backend that returns no ids (a hosted API) still works: its calls are stored and flagged not trainable.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, MutableMapping
from concurrent.futures import Future
from functools import partial
from typing import Any

import aiohttp
import orjson
from starlette.requests import Request
from starlette.responses import Response

from agl import protocol
from agl.common import attributes as attr
from agl.schema import ModelVersion
from agl.server.call_gate import CallGate, CallMeter
from agl.server.call_record import (
    MALFORMED,
    CallRecord,
    event_without_logprobs,
    json_or_none,
    off_loop_if_large,
    parse_chat,
    without_logprobs,
)
from agl.server.engines import Engine, EngineRouter
from agl.server.errors import openai_error as openai_error  # where the routes find it
from agl.server.relay import AnsweredResponse, BadAnswer, RelayResponse, error_message, hung_up, read_capped, take_event
from agl.server.request_cost import OFF_LOOP_BYTES
from agl.server.run_sampling import RunSampling
from agl.server.upstream_config import UpstreamConfig as UpstreamConfig  # where every caller finds it
from agl.store import Store

log = logging.getLogger(__name__)

TOKEN_ID_PARAM = "return_token_ids"
MODE_HEADER = protocol.HEADER_ROLLOUT_MODE
UPSTREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)
BAD_ANSWER = "upstream_bad_answer"
RELAY_PIECE = 32 * 1024  # bytes of a stream parsed per step of the event loop (about 2 ms of work)
ABANDONED_STREAM = "the agent hung up before the whole streamed answer reached it"
# the agl servers a call has passed through, each named by its instance id: a server refuses a call it sent itself
VIA_HEADER = "x-agl-via"
VIA_KEY = VIA_HEADER.encode()
SERVER_HEADER = "x-agl-server"  # on agl's model lists: which agl server answered
MAX_HOPS = 4


class LLMProxy:
    """Serves `/rollout/{rollout_id}/attempt/{attempt_id}/v1/chat/completions` (and `/v1/responses`, translated
    to chat completions) for one store."""

    def __init__(self, store: Store, upstream: UpstreamConfig, served_model: str) -> None:
        self.store = store
        self.upstream = upstream
        self.served_model = served_model
        self.model_version: ModelVersion | None = store.latest_model_version()
        self.meter = CallMeter()
        self.engines = EngineRouter([u for u in (upstream.base_url, *upstream.more_urls) if u])
        self.instance = secrets.token_hex(8)  # names this server in the via header of what it sends
        self.gate = CallGate(self.meter)  # closed by a trainer while it changes weights in place (call_gate)
        self.sampling = RunSampling(upstream)  # the run's sampling in place of a trained agent's (--own-sampling-for)
        self._token_ids_rejected = upstream.token_ids == "never"
        self._session: aiohttp.ClientSession | None = None
        # what the upstream serves (/v1/models), asked at the first call and every 30 s at most until it answers
        self.upstream_models: list[str] | None = None
        self._models_asked_at = -1e9
        self._models_probe: asyncio.Future[None] | None = None  # the upstream being asked for its models

    def _client(self) -> aiohttp.ClientSession:
        # aiohttp, not httpx: httpx's connection pool scans every connection on each request, which made it
        # most of the proxy's CPU time at concurrency 32. Created on first use: a session needs a running loop.
        if self._session is None:
            # aiohttp's `connect` timeout counts the wait for a pooled connection (at 10 s, calls past the pool's
            # size failed with 502): that wait is bounded by the upstream timeout, the TCP connect by a short one
            limit = self.upstream.max_connections
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=limit, limit_per_host=0, keepalive_timeout=60),
                timeout=aiohttp.ClientTimeout(
                    total=None, connect=self.upstream.timeout_s, sock_connect=10.0, sock_read=self.upstream.timeout_s
                ),
            )
        return self._session

    def http(self) -> aiohttp.ClientSession:
        """The session upstream requests go out on (the token-counting route's too)."""
        return self._client()

    async def upstream_model_for(self, requested: Any) -> Any:
        """The model name a call asking for `requested` reaches the upstream under, as `_upstream_payload` sends it."""
        await self.served_models()
        chosen = self.upstream.model or self._mapped_model(requested) or requested
        return (self.model_version.upstream_model if self.model_version is not None else None) or chosen

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

    def set_model_version(self, mv: ModelVersion) -> None:
        self.model_version = mv

    def models_response(self) -> Response:
        now = int(time.time())
        body = {
            "object": "list",
            "data": [{"id": self.served_model, "object": "model", "created": now, "owned_by": "agl"}],
        }
        # the header tells an engine being added that this URL is agl itself (routes_training refuses it)
        return Response(orjson.dumps(body), media_type="application/json", headers={SERVER_HEADER: self.instance})

    async def served_models(self) -> list[str] | None:
        """The upstream's model names (None: not known; it has not answered `/models` yet). Calls that arrive while
        the upstream is being asked wait for its answer (5 s at most) rather than go out under a name it may not
        serve: the first calls of a run come together."""
        if self.upstream_models is not None:
            return self.upstream_models
        probe = self._models_probe
        if probe is None or (probe.done() and time.monotonic() - self._models_asked_at > 30):
            self._models_asked_at = time.monotonic()
            probe = self._models_probe = asyncio.ensure_future(self._ask_models())
        if not probe.done():
            await asyncio.shield(probe)
        return self.upstream_models

    async def _ask_models(self) -> None:
        first = self.engines.first_in_rotation()  # every engine serves the same models: ask any one
        if first is None:
            return
        url = f"{first.url}/models"
        headers = self.upstream_headers(first)
        try:
            timeout = aiohttp.ClientTimeout(total=5)
            async with self._client().get(url, headers=headers, timeout=timeout, allow_redirects=False) as resp:
                listed = None
                if resp.status == 200:
                    answer = orjson.loads(await read_capped(resp, self.upstream.max_answer_bytes))
                    listed = answer.get("data") if isinstance(answer, dict) else None
            if isinstance(listed, list):
                self.upstream_models = [str(m["id"]) for m in listed if isinstance(m, dict) and "id" in m]
        except (*UPSTREAM_ERRORS, ValueError, BadAnswer) as exc:
            log.info("the upstream's model list is not known yet (%s): model names pass through", exc)

    def _mapped_model(self, requested: Any) -> str | None:
        """The upstream model a call asking for `requested` goes to, when agl picks it: the one model the upstream
        serves, or the requested one if it serves it; None: leave the name (unknown list, or a name it serves)."""
        served = self.upstream_models
        if not served or requested in served:
            return None
        return served[0] if len(served) == 1 else None

    async def model_problem(self, body: dict[str, Any]) -> str | None:
        """Why a call's model cannot be sent: the upstream serves several models and not the one asked for."""
        if self.upstream.model or (self.model_version is not None and self.model_version.upstream_model):
            return None  # agl names the model itself
        served = await self.served_models()
        requested = body.get("model")
        if served and len(served) > 1 and requested not in served:
            return (
                f"model {requested!r} is not served by the upstream, which serves {', '.join(served[:20])}: ask for "
                "one of them, or start agl serve with --upstream-model NAME"
            )
        return None

    def _upstream_payload(self, body: dict[str, Any], rec: CallRecord) -> dict[str, Any]:
        payload = dict(body)
        model = self.upstream.model or self._mapped_model(body.get("model"))
        if self.model_version is not None:
            rec.model_version = self.model_version.version
            model = self.model_version.upstream_model or model
            if rec.agent is not None:
                model = self.model_version.agent_models.get(rec.agent, model)
        if model:
            payload["model"] = model
        rec.model = payload.get("model")
        temperature = payload.get("temperature")
        if rec.mode == "eval" and self.upstream.eval_temperature is not None:
            temperature = self.upstream.eval_temperature
        elif rec.mode == "train" and (owned := self.sampling.apply(payload, rec)) is not None:
            temperature = owned
        elif isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
            temperature = self.upstream.temperature
        if temperature is not None:
            payload["temperature"] = temperature
        rec.temperature = None if temperature is None else float(temperature)
        if not self._token_ids_rejected:
            payload[TOKEN_ID_PARAM] = True
            payload["logprobs"] = True  # even if the agent said false: the trainer needs the behaviour log-probs
            rec.asked_token_ids = True
        return payload

    def _headers(self, rec: CallRecord, engine: Engine) -> dict[str, str]:
        # The rollout's mode travels to the backend: agl's embedded engine decodes eval rollouts greedily. The via
        # header names this server: an engine that leads back to it is refused there (`loop_problem`).
        return {
            "content-type": "application/json",
            "accept-encoding": "identity",
            MODE_HEADER: rec.mode,
            **self.upstream_headers(engine),
        }

    def upstream_headers(self, engine: Engine) -> dict[str, str]:
        """What every request to an engine carries: this server's name (a loop is refused) and the upstream's API
        key where the engine gets it."""
        headers = {VIA_HEADER: self.instance}
        if self.upstream.api_key and engine.gets_api_key:
            headers["authorization"] = f"Bearer {self.upstream.api_key}"
        return headers

    def loop_problem(self, scope: MutableMapping[str, Any]) -> str | None:
        """Why a call must be refused as a loop: it was sent by this very server (an engine that leads back to it),
        or has passed through more agl servers than any real set-up chains. Read from the raw headers: it is asked
        of every call."""
        raw = next((value for key, value in scope["headers"] if key == VIA_KEY), None)
        if raw is None:
            return None
        via = [v.strip() for v in raw.decode("latin-1").split(",") if v.strip()]
        if self.instance in via:
            return "this call was sent by this agl server to one of its engines: an engine must not lead back to agl"
        if len(via) >= MAX_HOPS:
            return f"this call has passed through {len(via)} agl servers: a loop of engines"
        return None

    def _rejected_token_ids(self, status: int, content: bytes) -> bool:
        return self.upstream.token_ids == "auto" and status == 400 and TOKEN_ID_PARAM.encode() in content

    def _leave(self, rec: CallRecord) -> None:
        tokens = len(rec.response_ids or [])
        self.meter.leave(rec, tokens)
        if rec.engine_used is not None:
            rec.engine_used.meter.leave(rec, tokens)

    def _store(self, rec: CallRecord, *, stream: bool) -> Future[None] | None:
        self._leave(rec)  # every forwarded call ends here, once, whatever happened
        return self._submit(rec, stream)

    def _submit(self, rec: CallRecord, stream: bool) -> Future[None] | None:
        """Build the call's record and queue it for the store (in the caller's thread: validating and encoding a
        large request is work the event loop should not do)."""
        try:
            call = rec.to_call(stream=stream)
        except Exception as exc:
            # the agent's answer must not fail because the record could not be built; nor may the call vanish
            log.exception("could not build the record of LLM call %s/%s", rec.attempt_id, rec.seq)
            call = rec.fallback_call(stream=stream, why=f"{type(exc).__name__}: {exc}")
        try:
            return self.store.add_llm_call(call)
        except Exception:
            log.exception("could not store LLM call %s/%s", rec.attempt_id, rec.seq)
            return None

    async def _stored(self, rec: CallRecord, *, stream: bool) -> None:
        """Store the call and wait for the commit: an answer the agent received is a call that survives a crash
        of the server (the writer commits in groups, so the wait is short)."""
        if rec.heavy:
            self._leave(rec)
            future = await asyncio.to_thread(self._submit, rec, stream)
        else:
            future = self._store(rec, stream=stream)
        if future is not None:
            try:
                await asyncio.wrap_future(future)
            except Exception:
                log.exception("could not store LLM call %s/%s", rec.attempt_id, rec.seq)

    async def chat_completions(self, request: Request, rollout_id: str, attempt_id: str) -> Response:
        if (loop := self.loop_problem(request.scope)) is not None:  # before the body costs anything
            return openai_error(508, loop, "invalid_request_error", "loop_detected")
        raw = await request.body()
        parsed = await off_loop_if_large(partial(parse_chat, max_structures=self.upstream.max_request_structures), raw)
        if isinstance(parsed, str):
            return openai_error(400, parsed, "invalid_request_error")
        return await self.answer_chat(parsed, request, rollout_id, attempt_id, heavy=len(raw) > OFF_LOOP_BYTES)

    async def answer_chat(
        self,
        body: dict[str, Any],
        request: Request,
        rollout_id: str,
        attempt_id: str,
        *,
        route: str = "chat",
        client_stream: bool | None = None,
        heavy: bool = False,
    ) -> Response:
        """Forward and record one chat-completions request of an attempt, its body already checked by
        `request_problem` (`route`: the API the agent called; `client_stream`: whether it asked for a stream, when
        the backend is asked otherwise; `heavy`: a large request, whose record is built off the event loop)."""
        if route != "chat" and (loop := self.loop_problem(request.scope)) is not None:  # chat's was asked already
            return openai_error(508, loop, "invalid_request_error", "loop_detected")  # nothing stored: no call
        owner = self.store.attempt_rollout(attempt_id)
        if owner is None or owner[0] != rollout_id:
            return openai_error(
                404,
                f"attempt {attempt_id!r} of rollout {rollout_id!r} does not exist",
                "invalid_request_error",
                "unknown_rollout",
            )
        if not owner[2]:
            # A call after the attempt ended (a straggler, a cancelled rollout) would become training data of
            # a rollout whose outcome is already decided: refused, nothing stored.
            return openai_error(
                409,
                f"attempt {attempt_id!r} of rollout {rollout_id!r} has ended: it takes no more LLM calls",
                "invalid_request_error",
                "attempt_ended",
            )
        if not self.engines.engines:
            return openai_error(
                503,
                "agl serve was started without --upstream: no LLM backend to forward to",
                "server_error",
                "no_upstream",
            )
        wrong_model = await self.model_problem(body)
        if wrong_model is not None:
            return openai_error(400, wrong_model, "invalid_request_error", "model_not_found")
        await self.gate.passed()  # before the model version is read: a held call goes to the next version
        rec = CallRecord(body, rollout_id, attempt_id, self.store.next_llm_seq(attempt_id), request.headers)
        self.meter.enter(rec)
        rec.mode = owner[1]
        rec.route, rec.client_stream = route, client_stream
        rec.heavy = heavy
        seq_header = {attr.HEADER_LLM_SEQ: str(rec.seq)}
        try:
            if body.get("stream"):
                return await self._stream(rec, seq_header)
            return await self._complete(rec, seq_header, request)
        except BaseException:
            self._leave(rec)  # a failure no path stored: not in flight any more either
            raise

    async def _post(self, rec: CallRecord) -> aiohttp.ClientResponse:
        """POST to the attempt's engine; the caller reads and releases the answer. An engine that cannot be
        reached (nothing was sent) is taken out of rotation and the call tried on the next, each engine once: the
        call fails (a 502, stored once) only when none could be reached."""
        engine = self._route(rec)
        tried: set[str] = set()
        asked_again = False  # once more on the same engine, without token ids, when it rejects them
        while True:
            payload = self._upstream_payload(rec.request, rec)
            try:
                # no redirects: the answer must come from the backend agl was pointed at (a redirect could send
                # the agent's conversation elsewhere); a 3xx is an unusable answer
                resp = await self._client().post(
                    f"{engine.url}/chat/completions",
                    data=orjson.dumps(payload),
                    headers=self._headers(rec, engine),
                    allow_redirects=False,
                )
            except aiohttp.ClientConnectorError as exc:
                tried.add(engine.url)
                other = self.engines.pick(rec.attempt_id, avoid=tried)
                if other is None:
                    raise  # counted against the engine where the failure is stored (`_upstream_failed`)
                self.engines.failed(engine, f"{type(exc).__name__}: {exc}")
                engine = self._route(rec, other)
                continue
            self.engines.answered(engine)
            if 300 <= resp.status < 400:
                resp.close()
                where = resp.headers.get("location")
                raise BadAnswer(f"HTTP {resp.status}, a redirect{f' to {where}' if where else ''}: agl follows none")
            if resp.status == 400 and rec.asked_token_ids and not asked_again:
                try:
                    content = await read_capped(resp, self.upstream.max_answer_bytes)
                except BaseException:
                    resp.close()
                    raise
                if self._rejected_token_ids(resp.status, content):
                    log.warning("upstream rejects %s: calls will be stored as not trainable", TOKEN_ID_PARAM)
                    self._token_ids_rejected = True
                    resp.release()
                    asked_again = True
                    continue
            return resp

    def _route(self, rec: CallRecord, engine: Engine | None = None) -> Engine:
        """Send the call to `engine` (or the one the router picks), counted on its meter; the record names it
        when there are several."""
        if rec.engine_used is not None:
            rec.engine_used.meter.leave(rec, 0)
        chosen = engine or self.engines.pick(rec.attempt_id)
        if chosen is None:
            raise aiohttp.ClientConnectionError("every engine was removed while the call waited")
        chosen.meter.enter(rec)
        rec.engine_used = chosen
        rec.engine = chosen.url if self.engines.several else None
        return chosen

    def _upstream_failed(self, rec: CallRecord, exc: Exception, seq_header: dict[str, str], stream: bool) -> Response:
        if rec.engine_used is not None and isinstance(exc, (aiohttp.ClientConnectionError, OSError)):
            self.engines.failed(rec.engine_used, f"{type(exc).__name__}: {exc}")
        rec.http_status = 502
        rec.error = f"upstream unreachable: {type(exc).__name__}: {exc}"
        self._store(rec, stream=stream)
        resp = openai_error(
            502, f"agl proxy could not reach the LLM backend: {exc}", "upstream_error", "upstream_unreachable"
        )
        resp.headers.update(seq_header)
        return resp

    def _bad_answer(self, rec: CallRecord, problem: str, seq_header: dict[str, str], stream: bool) -> Response:
        if rec.engine_used is not None:  # an engine that answers garbage leaves rotation as an unreachable one does
            self.engines.failed(rec.engine_used, f"unusable answer: {problem}"[:500])
        rec.http_status = 502
        rec.error = f"the LLM backend's answer is unusable: {problem}"
        self._store(rec, stream=stream)
        resp = openai_error(
            502, f"agl proxy got an unusable answer from the LLM backend: {problem}", "upstream_error", BAD_ANSWER
        )
        resp.headers.update(seq_header)
        return resp

    def _engine_erred(self, rec: CallRecord, status: int, parsed: Any) -> None:
        """An engine's failure (a 5xx, or an answer that is not JSON) takes it out of rotation; a 4xx is the
        request's fault, not the engine's."""
        if rec.engine_used is not None and (status >= 500 or not isinstance(parsed, dict)):
            why = rec.error if isinstance(parsed, dict) else f"unusable answer: {rec.error}"
            self.engines.failed(rec.engine_used, (why or f"HTTP {status}")[:500])

    async def _fetch(self, rec: CallRecord) -> tuple[int, bytes, Any]:
        """The upstream's status, answer and the answer parsed (None: not JSON), a large one parsed off the loop."""
        resp = await self._post(rec)
        try:
            content = await read_capped(resp, self.upstream.max_answer_bytes)
        finally:
            resp.release()
        return resp.status, content, await off_loop_if_large(json_or_none, content)

    async def _complete(self, rec: CallRecord, seq_header: dict[str, str], request: Request) -> Response:
        # the wait for the backend races the agent's hang-up: a call it gave up on is not stored as answered
        fetch = asyncio.ensure_future(self._fetch(rec))
        hangup = asyncio.ensure_future(hung_up(request))
        await asyncio.wait((fetch, hangup), return_when=asyncio.FIRST_COMPLETED)
        if not fetch.done():
            fetch.cancel()  # closes the backend connection: vLLM aborts the request
            with contextlib.suppress(BaseException):
                await fetch
            rec.http_status, rec.abandoned = 499, True
            rec.error = "the agent hung up before the answer came"
            self._store(rec, stream=False)
            return Response(status_code=499)  # nobody is listening
        hangup.cancel()
        try:
            status, content, parsed = fetch.result()
        except BadAnswer as exc:
            return self._bad_answer(rec, str(exc), seq_header, stream=False)
        except UPSTREAM_ERRORS as exc:
            return self._upstream_failed(rec, exc, seq_header, stream=False)
        rec.http_status = status
        if status >= 400 or not isinstance(parsed, dict):
            rec.error = error_message(parsed, content, status)
            self._engine_erred(rec, status, parsed)
            self._store(rec, stream=False)
            if isinstance(parsed, dict) and "error" in parsed:
                return Response(content, status_code=status, media_type="application/json", headers=seq_header)
            answered = status if status >= 400 else 502
            return openai_error(answered, f"LLM backend answered {status}: {rec.error}", "upstream_error")
        problem = rec.take_choice(parsed) or rec.misaligned()
        if problem is not None:
            return self._bad_answer(rec, problem.removeprefix(f"{MALFORMED}: "), seq_header, stream=False)
        await self._stored(rec, stream=False)
        if rec.strip_logprobs:
            content = orjson.dumps(without_logprobs(parsed))
        return AnsweredResponse(content, parsed, status_code=status, media_type="application/json", headers=seq_header)

    async def _stream(self, rec: CallRecord, seq_header: dict[str, str]) -> Response:
        try:
            resp = await self._post(rec)
            if resp.status >= 400:
                try:
                    content = await read_capped(resp, self.upstream.max_answer_bytes)
                finally:
                    resp.release()
        except BadAnswer as exc:
            return self._bad_answer(rec, str(exc), seq_header, stream=True)
        except UPSTREAM_ERRORS as exc:
            return self._upstream_failed(rec, exc, seq_header, stream=True)
        rec.http_status = resp.status
        if resp.status >= 400:
            try:
                parsed = orjson.loads(content)
            except orjson.JSONDecodeError:
                parsed = None
            rec.error = error_message(parsed, content, resp.status)
            self._engine_erred(rec, resp.status, parsed)
            self._store(rec, stream=True)
            if isinstance(parsed, dict) and "error" in parsed:
                return Response(content, status_code=resp.status, media_type="application/json", headers=seq_header)
            return openai_error(resp.status, f"LLM backend answered {resp.status}: {rec.error}", "upstream_error")
        return RelayResponse(
            self._relay(resp, rec), rec, status_code=resp.status, media_type="text/event-stream", headers=seq_header
        )

    async def _relay(self, resp: aiohttp.ClientResponse, rec: CallRecord) -> AsyncIterator[bytes]:
        """Pass SSE bytes through untouched while parsing the events they carry.

        Linear in the stream's length: the bytes of an event not yet complete wait in one growing buffer, each is
        searched for the end of an event once (a search resumes where the last stopped, one byte back for a
        `\\n\\n` split across chunks), and the complete events leave it in one cut per chunk."""
        pending = bytearray()
        stored = cut = False
        relayed = events = 0
        token_cap = self._stream_token_cap(rec)
        try:
            # in pieces, with the loop let go between them: one read of all aiohttp had buffered was up to 768 KB of
            # events parsed in one step, and every other request waited 50-250 ms behind it
            async for chunk in resp.content.iter_chunked(RELAY_PIECE):
                searched = max(len(pending) - 1, 0)
                pending += chunk
                done = False
                rewritten: list[bytes] = []
                taken = 0
                while (end := pending.find(b"\n\n", max(searched, taken))) >= 0:
                    event = bytes(pending[taken:end])
                    taken = end + 2
                    events += 1
                    done = take_event(event, rec) or done
                    if rec.strip_logprobs:
                        rewritten.append(event_without_logprobs(event) + b"\n\n")
                if taken:
                    del pending[:taken]
                relayed += len(chunk)
                why = None
                if len(pending) > self.upstream.max_event_bytes:
                    why = (
                        f"an SSE event past {self.upstream.max_event_bytes} bytes without the blank line that ends"
                        " it: the stream was cut"
                    )
                elif relayed > self.upstream.max_stream_bytes:
                    why = f"the stream passed {self.upstream.max_stream_bytes} bytes without ending: it was cut"
                elif max(events, len(rec.response_ids or ())) > token_cap:
                    why = f"the stream passed {token_cap} tokens (events) without ending: it was cut"
                if why is not None:
                    # the agent has its 200 and maybe part of an event: the stream ends with an error event, as
                    # vLLM ends a stream that fails (OpenAI's SDKs raise it), after a blank line ending the part
                    cut = True
                    if not stored:
                        rec.error = f"{MALFORMED}: {why}"
                    resp.close()
                    yield b"\n\ndata: " + protocol.error_bytes(why, "upstream_error", BAD_ANSWER) + b"\n\n"
                    break
                if done and not stored:
                    stored = True
                    await self._stored(rec, stream=True)  # committed before the agent sees [DONE]
                if not rec.strip_logprobs:
                    yield chunk  # byte for byte
                elif rewritten:
                    yield b"".join(rewritten)  # whole events only; a partial one waits in the buffer
                await asyncio.sleep(0)
            if rec.strip_logprobs and pending and not cut:
                yield bytes(pending)
        except BaseException as exc:
            if rec.abandoned:
                rec.http_status, rec.error = 499, ABANDONED_STREAM
            elif not stored:
                rec.error = f"stream interrupted: {type(exc).__name__}: {exc}".rstrip(": ")
                if rec.engine_used is not None and isinstance(exc, (aiohttp.ClientPayloadError, OSError)):
                    self.engines.failed(rec.engine_used, rec.error)  # it went away mid-answer
            raise
        finally:
            resp.release()
            if not stored:
                if rec.error is None:
                    rec.error = "the backend closed the stream without [DONE]"
                if rec.engine_used is not None and rec.error.startswith(MALFORMED):
                    self.engines.failed(rec.engine_used, rec.error[:500])
                self._store(rec, stream=True)
            elif rec.abandoned:
                # stored as answered (committed before the last bytes went out), but the agent left first
                try:
                    self.store.mark_llm_call_abandoned(rec.attempt_id, rec.seq, f"abandoned: {ABANDONED_STREAM}")
                except Exception:
                    log.exception("could not mark LLM call %s/%s abandoned", rec.attempt_id, rec.seq)

    def _stream_token_cap(self, rec: CallRecord) -> int:
        """The most tokens (or events, of a token or more) a stream of this call may carry: what the request allows
        each choice and some slack (a final usage event, a backend counting differently), else the cap."""
        asked = [
            v
            for v in (rec.request.get("max_tokens"), rec.request.get("max_completion_tokens"))
            if isinstance(v, int) and not isinstance(v, bool)
        ]
        n = rec.request.get("n")
        choices = n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1
        return (min(asked) + 64) * choices if asked else self.upstream.max_stream_tokens
