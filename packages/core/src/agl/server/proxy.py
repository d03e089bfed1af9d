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
import time
from collections.abc import AsyncIterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import aiohttp
import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from agl import protocol
from agl.schema import Attribution, LLMCall, ModelVersion
from agl.server import responses as responses_api
from agl.store import Store, new_id
from agl.tracing import attributes as attr

log = logging.getLogger(__name__)

TOKEN_ID_PARAM = "return_token_ids"
MODE_HEADER = protocol.HEADER_ROLLOUT_MODE
UPSTREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)


@dataclass
class UpstreamConfig:
    base_url: str | None  # an OpenAI-compatible base URL ending in /v1; None: no backend configured
    api_key: str | None = None
    model: str | None = None  # replaces the model the agent asked for, when set
    token_ids: str = "auto"  # "auto": ask, and stop asking if the backend rejects it; "always"; "never"
    timeout_s: float = 600.0
    # the sampling temperature of a call whose agent sets none; always sent, so the store knows the distribution
    # every response was drawn from (a backend's own default may be anything: vLLM uses the model's config)
    temperature: float | None = 1.0
    # every call of an evaluation rollout is sent with this temperature, whatever the agent asked for, so that
    # evaluations against any backend decode alike (agl's own engine does the same from the mode header)
    eval_temperature: float | None = None


# Sampling parameters that change the distribution a response is drawn from beyond the temperature, with the
# value that leaves it alone. agl trains on softmax(logits / T): a sample drawn from a truncated or penalised
# distribution is not a sample of that policy, so such calls are stored as not trainable (in train rollouts).
_NEUTRAL_SAMPLING: dict[str, tuple[Any, ...]] = {
    "top_p": (None, 1, 1.0),
    "top_k": (None, 0, -1),
    "min_p": (None, 0, 0.0),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "logit_bias": (None, {}),
}


def untrainable_sampling(body: dict[str, Any], temperature: float | None) -> str | None:
    """Why a response sampled with these parameters is not a sample of the policy agl trains, or None."""
    if temperature is not None and temperature <= 0:
        return "sampled greedily (temperature 0): not a sample of the policy's distribution"
    for key, neutral in _NEUTRAL_SAMPLING.items():
        value = body.get(key)
        if value not in neutral:
            return f"sampled with {key}={value!r}: agl trains the temperature-scaled distribution only"
    return None


def openai_error(status: int, message: str, type_: str, code: str | None = None) -> Response:
    return Response(protocol.error_bytes(message, type_, code), status_code=status, media_type="application/json")


class _CallRecord:
    """What the proxy learns about one call while it runs; becomes an `LLMCall`."""

    def __init__(self, request_body: dict[str, Any], rollout_id: str, attempt_id: str, seq: int, headers: Any) -> None:
        self.started = time.time()
        self.t0 = time.perf_counter()
        self.request = request_body
        self.rollout_id = rollout_id
        self.attempt_id = attempt_id
        self.seq = seq
        agent = headers.get(attr.HEADER_AGENT)
        self.agent: str | None = unquote(agent) if agent else None  # percent-encoded UTF-8 (see http_inject)
        key = headers.get(attr.HEADER_AGENT_KEY) if agent else None
        self.agent_key: str | None = unquote(key) if key else None
        self.hooked = agent is not None or headers.get(attr.HEADER_HOOK) is not None
        self.parent_span: str | None = headers.get(attr.HEADER_PARENT_SPAN) or None
        self.trace_id: str | None = None
        traceparent = headers.get(attr.HEADER_TRACEPARENT)
        if traceparent:
            parts = traceparent.split("-")
            if len(parts) == 4 and len(parts[1]) == 32:
                self.trace_id = parts[1]
        self.model: str | None = None
        self.model_version: int | None = None
        self.prompt_ids: list[int] | None = None
        self.response_ids: list[int] | None = None
        self.logprobs: list[float] | None = None
        self.content: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.message: dict[str, Any] | None = None
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] = {}
        self.http_status = 200
        self.error: str | None = None
        self.asked_token_ids = False
        self.mode = "train"
        self.temperature: float | None = None  # the temperature the backend was asked to sample with
        # the agent said `"logprobs": false`: agl still asks the backend (training needs them) and takes them
        # out of the answer the agent gets
        self.strip_logprobs = request_body.get("logprobs") is False
        self.abandoned = False  # the agent hung up before the answer

    def take_choice(self, body: dict[str, Any]) -> None:
        """Read a complete (non-streaming) response."""
        choices = body.get("choices") or []
        self.usage = body.get("usage") or {}
        self.prompt_ids = body.get("prompt_token_ids")
        if not choices:
            return
        choice = choices[0]
        self.message = choice.get("message")
        self.finish_reason = choice.get("finish_reason")
        self.response_ids = choice.get("token_ids")
        if self.prompt_ids is None:
            self.prompt_ids = choice.get("prompt_token_ids")
        content = (choice.get("logprobs") or {}).get("content")
        if content is not None:
            self.logprobs = [float(c["logprob"]) for c in content]

    def take_chunk(self, chunk: dict[str, Any]) -> None:
        """Accumulate one streamed chunk."""
        if chunk.get("prompt_token_ids") is not None:
            self.prompt_ids = chunk["prompt_token_ids"]
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            if choice.get("prompt_token_ids") is not None and self.prompt_ids is None:
                self.prompt_ids = choice["prompt_token_ids"]
            ids = choice.get("token_ids")
            if ids is not None:
                self.response_ids = (self.response_ids or []) + list(ids)
            content = (choice.get("logprobs") or {}).get("content")
            if content:
                self.logprobs = (self.logprobs or []) + [float(c["logprob"]) for c in content]
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.content.append(delta["content"])
            for tc in delta.get("tool_calls") or []:
                slot = self.tool_calls.setdefault(
                    tc.get("index", 0), {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
                )
                if tc.get("id"):
                    slot["id"] = tc["id"]
                fn = tc.get("function") or {}
                if fn.get("name"):
                    slot["function"]["name"] += fn["name"]
                if fn.get("arguments"):
                    slot["function"]["arguments"] += fn["arguments"]
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def fallback_call(self, *, stream: bool, why: str) -> LLMCall:
        """A minimal record of a call whose full record could not be built: stored, flagged, never lost."""
        return LLMCall(
            id=new_id("llm"),
            rollout_id=self.rollout_id,
            attempt_id=self.attempt_id,
            seq=self.seq,
            agent_name=self.agent,
            agent_key=self.agent_key,
            attribution=Attribution.scope if self.agent else Attribution.unattributed,
            trace_id=self.trace_id,
            parent_span_id=self.parent_span,
            model_requested=None,
            model=None,
            model_version=self.model_version,
            request={"unrecorded": why},
            response_message=None,
            prompt_ids=None,
            response_ids=None,
            logprobs=None,
            finish_reason=self.finish_reason,
            stream=stream,
            status="error",
            http_status=self.http_status,
            error=f"the call could not be recorded: {why}",
            started_at=self.started,
            latency_s=time.perf_counter() - self.t0,
            usage={},
            trainable=False,
            not_trainable_reason=f"the call could not be recorded: {why}",
            temperature=self.temperature,
        )

    def to_call(self, *, stream: bool) -> LLMCall:
        message = self.message
        if stream and (self.content or self.tool_calls):
            message = {"role": "assistant", "content": "".join(self.content) or None}
            if self.tool_calls:
                message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        reason = None
        if self.abandoned:
            reason = "abandoned: the agent hung up before the answer"
        elif self.error is not None:
            reason = "the call failed"
        elif not self.prompt_ids or self.response_ids is None:
            reason = "the backend returned no token ids" if self.asked_token_ids else "token ids were not requested"
        elif int(self.request.get("n") or 1) != 1:
            reason = "n > 1: only the first choice is stored"
        elif self.mode == "train":
            reason = untrainable_sampling(self.request, self.temperature)
        usage = self.usage or {
            "prompt_tokens": len(self.prompt_ids or []),
            "completion_tokens": len(self.response_ids or []),
        }
        return LLMCall(
            id=new_id("llm"),
            rollout_id=self.rollout_id,
            attempt_id=self.attempt_id,
            seq=self.seq,
            agent_name=self.agent,
            attribution=(
                Attribution.scope if self.agent else (Attribution.unattributed if self.hooked else Attribution.unhooked)
            ),
            trace_id=self.trace_id,
            parent_span_id=self.parent_span,
            model_requested=self.request.get("model"),
            model=self.model,
            model_version=self.model_version,
            request=self.request,
            response_message=message,
            prompt_ids=self.prompt_ids,
            response_ids=self.response_ids,
            logprobs=self.logprobs,
            finish_reason=self.finish_reason,
            stream=stream,
            status="error" if self.error else "ok",
            http_status=self.http_status,
            error=self.error,
            started_at=self.started,
            latency_s=time.perf_counter() - self.t0,
            usage=usage,
            trainable=reason is None,
            not_trainable_reason=reason,
            temperature=self.temperature,
            agent_key=self.agent_key,
        )


class LLMProxy:
    """Serves `/rollout/{rollout_id}/attempt/{attempt_id}/v1/chat/completions` (and `/v1/responses`, translated
    to chat completions) for one store."""

    def __init__(self, store: Store, upstream: UpstreamConfig, served_model: str) -> None:
        self.store = store
        self.upstream = upstream
        self.served_model = served_model
        self.model_version: ModelVersion | None = store.latest_model_version()
        self._token_ids_rejected = upstream.token_ids == "never"
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        # aiohttp, not httpx: httpx's connection pool scans every connection on each request, which made it
        # most of the proxy's CPU time at concurrency 32. Created on first use: a session needs a running loop.
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=1024, limit_per_host=0, keepalive_timeout=60),
                timeout=aiohttp.ClientTimeout(total=None, connect=10.0, sock_read=self.upstream.timeout_s),
            )
        return self._session

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
        return Response(orjson.dumps(body), media_type="application/json")

    def _upstream_payload(self, body: dict[str, Any], rec: _CallRecord) -> dict[str, Any]:
        payload = dict(body)
        model = self.upstream.model
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

    def _headers(self, rec: _CallRecord) -> dict[str, str]:
        # The rollout's mode travels to the backend: agl's embedded engine decodes eval rollouts greedily.
        headers = {"content-type": "application/json", "accept-encoding": "identity", MODE_HEADER: rec.mode}
        if self.upstream.api_key:
            headers["authorization"] = f"Bearer {self.upstream.api_key}"
        return headers

    def _rejected_token_ids(self, status: int, content: bytes) -> bool:
        return self.upstream.token_ids == "auto" and status == 400 and TOKEN_ID_PARAM.encode() in content

    def _store(self, rec: _CallRecord, *, stream: bool) -> Future[None] | None:
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

    async def _stored(self, rec: _CallRecord, *, stream: bool) -> None:
        """Store the call and wait for the commit: an answer the agent received is a call that survives a crash
        of the server (the writer commits in groups, so the wait is short)."""
        future = self._store(rec, stream=stream)
        if future is not None:
            try:
                await asyncio.wrap_future(future)
            except Exception:
                log.exception("could not store LLM call %s/%s", rec.attempt_id, rec.seq)

    async def chat_completions(self, request: Request, rollout_id: str, attempt_id: str) -> Response:
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            return openai_error(400, f"request body is not valid JSON: {exc}", "invalid_request_error")
        return await self.answer_chat(body, request, rollout_id, attempt_id)

    async def responses(self, request: Request, rollout_id: str, attempt_id: str) -> Response:
        """The Responses API, through the chat path (agl.server.responses says why)."""
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            return openai_error(400, f"request body is not valid JSON: {exc}", "invalid_request_error")
        if not isinstance(body, dict):
            return openai_error(400, "the request body must be a JSON object", "invalid_request_error")
        try:
            chat = responses_api.to_chat(body)
        except responses_api.ResponsesRequestError as exc:
            return openai_error(400, str(exc), "invalid_request_error")
        answer = await self.answer_chat(chat, request, rollout_id, attempt_id)
        if answer.status_code != 200:
            return answer  # an error in the OpenAI envelope, which the Responses API uses too
        result = responses_api.from_chat(orjson.loads(bytes(answer.body)), body)
        headers = {k: v for k, v in answer.headers.items() if k == attr.HEADER_LLM_SEQ}
        if body.get("stream"):
            return StreamingResponse(
                iter(list(responses_api.stream_events(result))), media_type="text/event-stream", headers=headers
            )
        return Response(orjson.dumps(result), media_type="application/json", headers=headers)

    async def answer_chat(self, body: Any, request: Request, rollout_id: str, attempt_id: str) -> Response:
        """Check, forward and record one chat-completions request of an attempt."""
        problem = request_problem(body)
        if problem is not None:
            return openai_error(400, problem, "invalid_request_error")
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
        if self.upstream.base_url is None:
            return openai_error(
                503,
                "agl serve was started without --upstream: no LLM backend to forward to",
                "server_error",
                "no_upstream",
            )
        rec = _CallRecord(body, rollout_id, attempt_id, self.store.next_llm_seq(attempt_id), request.headers)
        rec.mode = owner[1]
        seq_header = {attr.HEADER_LLM_SEQ: str(rec.seq)}
        if body.get("stream"):
            return await self._stream(rec, seq_header)
        return await self._complete(rec, seq_header, request)

    async def _post(self, rec: _CallRecord) -> aiohttp.ClientResponse:
        """POST to the upstream; the caller reads and releases the answer."""
        url = f"{self.upstream.base_url.rstrip('/')}/chat/completions"  # type: ignore[union-attr]
        for _ in range(2):
            payload = self._upstream_payload(rec.request, rec)
            resp = await self._client().post(url, data=orjson.dumps(payload), headers=self._headers(rec))
            if resp.status == 400 and rec.asked_token_ids:
                content = await resp.read()
                if self._rejected_token_ids(resp.status, content):
                    log.warning("upstream rejects %s: calls will be stored as not trainable", TOKEN_ID_PARAM)
                    self._token_ids_rejected = True
                    resp.release()
                    continue
            return resp
        return resp

    def _upstream_failed(self, rec: _CallRecord, exc: Exception, seq_header: dict[str, str], stream: bool) -> Response:
        rec.http_status = 502
        rec.error = f"upstream unreachable: {type(exc).__name__}: {exc}"
        self._store(rec, stream=stream)
        resp = openai_error(
            502, f"agl proxy could not reach the LLM backend: {exc}", "upstream_error", "upstream_unreachable"
        )
        resp.headers.update(seq_header)
        return resp

    async def _fetch(self, rec: _CallRecord) -> tuple[int, bytes]:
        resp = await self._post(rec)
        try:
            return resp.status, await resp.read()
        finally:
            resp.release()

    async def _complete(self, rec: _CallRecord, seq_header: dict[str, str], request: Request) -> Response:
        # The agent may give up while the backend works (a client timeout): its call must not be stored as
        # if it had been answered, so the wait for the backend races the agent's hang-up.
        fetch = asyncio.ensure_future(self._fetch(rec))
        hangup = asyncio.ensure_future(_hung_up(request))
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
            status, content = fetch.result()
        except UPSTREAM_ERRORS as exc:
            return self._upstream_failed(rec, exc, seq_header, stream=False)
        rec.http_status = status
        try:
            parsed = orjson.loads(content)
        except orjson.JSONDecodeError:
            parsed = None
        if status >= 400 or not isinstance(parsed, dict):
            rec.error = _error_message(parsed, content, status)
            self._store(rec, stream=False)
            if isinstance(parsed, dict) and "error" in parsed:
                return Response(content, status_code=status, media_type="application/json", headers=seq_header)
            answered = status if status >= 400 else 502
            return openai_error(answered, f"LLM backend answered {status}: {rec.error}", "upstream_error")
        rec.take_choice(parsed)
        await self._stored(rec, stream=False)
        if rec.strip_logprobs:
            content = orjson.dumps(_without_logprobs(parsed))
        return Response(content, status_code=status, media_type="application/json", headers=seq_header)

    async def _stream(self, rec: _CallRecord, seq_header: dict[str, str]) -> Response:
        try:
            resp = await self._post(rec)
            if resp.status >= 400:
                try:
                    content = await resp.read()
                finally:
                    resp.release()
        except UPSTREAM_ERRORS as exc:
            return self._upstream_failed(rec, exc, seq_header, stream=True)
        rec.http_status = resp.status
        if resp.status >= 400:
            try:
                parsed = orjson.loads(content)
            except orjson.JSONDecodeError:
                parsed = None
            rec.error = _error_message(parsed, content, resp.status)
            self._store(rec, stream=True)
            if isinstance(parsed, dict) and "error" in parsed:
                return Response(content, status_code=resp.status, media_type="application/json", headers=seq_header)
            return openai_error(resp.status, f"LLM backend answered {resp.status}: {rec.error}", "upstream_error")
        return StreamingResponse(
            self._relay(resp, rec), status_code=resp.status, media_type="text/event-stream", headers=seq_header
        )

    async def _relay(self, resp: aiohttp.ClientResponse, rec: _CallRecord) -> AsyncIterator[bytes]:
        """Pass SSE bytes through untouched while parsing the events they carry."""
        buffer = b""
        stored = False
        try:
            async for chunk in resp.content.iter_any():
                buffer += chunk
                done = False
                rewritten = b""
                while b"\n\n" in buffer:
                    event, buffer = buffer.split(b"\n\n", 1)
                    done = self._take_event(event, rec) or done
                    if rec.strip_logprobs:
                        rewritten += _event_without_logprobs(event) + b"\n\n"
                if done and not stored:
                    stored = True
                    await self._stored(rec, stream=True)  # committed before the agent sees [DONE]
                if not rec.strip_logprobs:
                    yield chunk  # byte for byte
                elif rewritten:
                    yield rewritten  # whole events only; a partial one waits in the buffer
            if rec.strip_logprobs and buffer:
                yield buffer
        except BaseException as exc:
            if not stored:
                rec.error = f"stream interrupted: {type(exc).__name__}: {exc}".rstrip(": ")
            raise
        finally:
            resp.release()
            if not stored:
                if rec.error is None:
                    rec.error = "the backend closed the stream without [DONE]"
                self._store(rec, stream=True)

    @staticmethod
    def _take_event(event: bytes, rec: _CallRecord) -> bool:
        done = False
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                continue
            try:
                chunk = orjson.loads(data)
            except orjson.JSONDecodeError:
                continue
            if isinstance(chunk, dict):
                if "error" in chunk:
                    rec.error = _error_message(chunk, data, 200)
                rec.take_chunk(chunk)
        return done


# Request fields the proxy reads, with the JSON types they must have (and how to say so); anything else goes to
# the backend as it is.
_FIELD_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "model": ((str,), "a string"),
    "stream": ((bool,), "true or false"),
    "n": ((int,), "an integer"),
    "temperature": ((int, float), "a number"),
    "top_p": ((int, float), "a number"),
    "max_tokens": ((int,), "an integer"),
    "max_completion_tokens": ((int,), "an integer"),
    "logprobs": ((bool,), "true or false"),
    "tools": ((list,), "a list"),
}


def request_problem(body: Any) -> str | None:
    """Why a chat request cannot be forwarded and recorded faithfully, or None. Checked before anything is
    sent: a request the store could not record must be refused, not answered and then lost."""
    if not isinstance(body, dict):
        return "request body must be a JSON object"
    messages = body.get("messages")
    if not isinstance(messages, list):
        return "request body must be a JSON object with a 'messages' list"
    if not all(isinstance(m, dict) for m in messages):
        return "every entry of 'messages' must be an object"
    for key, (types, expected) in _FIELD_TYPES.items():
        value = body.get(key)
        if value is None:
            continue
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            return f"'{key}' must be {expected}, got {json_type(value)}"
    n = body.get("n")
    if n is not None and not 1 <= n <= 128:
        return f"'n' must be between 1 and 128, got {n}"
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if value is not None and not 1 <= value <= 2**31:
            return f"'{key}' must be a positive integer below 2**31, got {value}"
    return None


def json_type(value: Any) -> str:
    names = {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }
    return "null" if value is None else names.get(type(value), type(value).__name__)


async def _hung_up(request: Request) -> None:
    """Returns when the client disconnects (its body was read already, so the next message is the hang-up)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _without_logprobs(body: dict[str, Any]) -> dict[str, Any]:
    """The answer as an agent that asked for no log-probs would get it (the backend was asked for them)."""
    for choice in body.get("choices") or []:
        if isinstance(choice, dict) and "logprobs" in choice:
            choice["logprobs"] = None
    return body


def _event_without_logprobs(event: bytes) -> bytes:
    lines = []
    for line in event.split(b"\n"):
        if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
            try:
                chunk = orjson.loads(line[5:].strip())
            except orjson.JSONDecodeError:
                chunk = None
            if isinstance(chunk, dict):
                line = b"data: " + orjson.dumps(_without_logprobs(chunk))
        lines.append(line)
    return b"\n".join(lines)


def _error_message(parsed: Any, content: bytes, status: int) -> str:
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        return str(parsed["error"].get("message") or parsed["error"])
    if isinstance(parsed, dict) and "error" in parsed:
        return str(parsed["error"])
    text = content[:500].decode(errors="replace")
    return f"HTTP {status}: {text}" if text else f"HTTP {status}"
