"""The proxy's APIs served through chat completions: OpenAI's Responses API (agl.server.responses) and Anthropic's
Messages API (agl.server.anthropic_messages). Each request is parsed and checked (off the event loop when large),
translated, answered and recorded by the proxy's chat path under its own route, and the answer translated back (off
the event loop when large); a stream is asked of the backend as a chat stream and each of its chunks sent on as that
API's events when it comes. Whatever fails in a translation is answered in the API's envelope, never a 500: a request
with a 400, an answer with a 502, its call (stored by the proxy before the translation) marked not trainable, since
the agent never received it."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, cast

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from agl.common import attributes as attr
from agl.schema import LLMCall
from agl.server import anthropic_messages as messages_api
from agl.server import responses as responses_api
from agl.server.call_record import (
    MAX_JSON_DEPTH,
    CallRecord,
    depth_problem,
    off_loop_if_large,
    request_problem,
)
from agl.server.proxy import LLMProxy, openai_error
from agl.server.relay import AnsweredResponse, RelayResponse, error_message
from agl.server.request_cost import (
    MAX_REQUEST_STRUCTURES,
    OFF_LOOP_BYTES,
    count_structures,
    heavy_lane,
    structure_problem,
)

log = logging.getLogger(__name__)
TRANSLATION_FAILED = "translation_failed"  # the error code of an answer that could not be translated back


def parsed_object(raw: bytes, max_structures: int) -> dict[str, Any] | str:
    """A translated API's request body, parsed and checked before its translation (the answer echoes parts of the
    request): the object, or why it is refused."""
    large = len(raw) > OFF_LOOP_BYTES
    opened = count_structures(raw) if large else None
    if (dense := structure_problem(raw, max_structures, opened=opened)) is not None:
        return dense
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return f"request body is not valid JSON: {exc}"
    if not isinstance(body, dict):
        return "the request body must be a JSON object"
    if opened is not None and opened <= MAX_JSON_DEPTH:  # too few objects and lists to nest too deep
        return body
    return depth_problem(body, large=large) or body


def untranslatable(exc: Exception) -> str:
    log.info("a request that could not be translated", exc_info=exc)
    return f"the request could not be translated: {type(exc).__name__}: {exc}"


def parse_responses(
    raw: bytes, max_structures: int = MAX_REQUEST_STRUCTURES
) -> tuple[dict[str, Any], dict[str, Any]] | str:
    """A Responses API request body, parsed, checked and translated: (the body, its chat request), or why it is
    refused (a 400)."""
    body = parsed_object(raw, max_structures)
    if isinstance(body, str):
        return body
    try:
        chat = responses_api.to_chat(body)
    except responses_api.ResponsesRequestError as exc:
        return str(exc)
    except Exception as exc:  # a request no check foresaw (a field of another type): the agent's to fix
        return untranslatable(exc)
    problem = request_problem(chat)
    return problem if problem is not None else (body, chat)


def parse_messages(
    raw: bytes, max_structures: int = MAX_REQUEST_STRUCTURES
) -> tuple[dict[str, Any], dict[str, Any]] | str:
    """A Messages API request body, parsed, checked and translated: (the body, its chat request), or why it is
    refused (a 400)."""
    body = parsed_object(raw, max_structures)
    if isinstance(body, str):
        return body
    if not isinstance(body.get("max_tokens"), int) or isinstance(body.get("max_tokens"), bool):
        return "max_tokens is required: an integer, the most tokens the answer may have"
    try:
        chat = messages_api.to_chat(body)
    except messages_api.MessagesRequestError as exc:
        return str(exc)
    except Exception as exc:  # a request no check foresaw (a field of another type): the agent's to fix
        return untranslatable(exc)
    problem = request_problem(chat)
    return problem if problem is not None else (body, chat)


class StreamTranslator(Protocol):
    """What turns a chat stream into a translated API's events (`anthropic_messages.MessagesStream`,
    `responses.ResponsesStream`)."""

    finished: bool
    unreceived: str | None  # why the agent could not take the answer it was streamed, once finished
    held_bytes: int  # what the open block holds: the work its end costs

    def chunk(self, chunk: dict[str, Any]) -> list[bytes]: ...

    def done(self) -> list[bytes]: ...

    def error(self, status: int, message: str) -> bytes: ...


@dataclass(frozen=True)
class TranslatedAPI:
    route: str
    parse: Callable[[bytes], tuple[dict[str, Any], dict[str, Any]] | str]
    # (chat answer, the API's request, the answer's id or None: a new one) → the API's answer
    back: Callable[[dict[str, Any], dict[str, Any], str | None], dict[str, Any]]
    stream: Callable[[dict[str, Any], str | None], StreamTranslator]
    refuse: Callable[[int, str], Response]


async def responses(proxy: LLMProxy, request: Request, rollout_id: str, attempt_id: str) -> Response:
    """The Responses API (agl.server.responses says why through chat completions); errors in the OpenAI envelope,
    which that API uses too."""
    api = TranslatedAPI(
        route="responses",
        parse=partial(parse_responses, max_structures=proxy.upstream.max_request_structures),
        back=responses_api.from_chat,
        stream=responses_api.ResponsesStream,
        refuse=openai_refusal,
    )
    return await _translated(proxy, request, rollout_id, attempt_id, api)


async def messages(proxy: LLMProxy, request: Request, rollout_id: str, attempt_id: str) -> Response:
    """Anthropic's Messages API (agl.server.anthropic_messages); errors in Anthropic's envelope."""
    api = TranslatedAPI(
        route="messages",
        parse=partial(parse_messages, max_structures=proxy.upstream.max_request_structures),
        back=messages_api.from_chat,
        stream=messages_api.MessagesStream,
        refuse=anthropic_error,
    )
    return await _translated(proxy, request, rollout_id, attempt_id, api)


def anthropic_error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return Response(
        messages_api.error_body(status, message), status_code=status, media_type="application/json", headers=headers
    )


def openai_refusal(status: int, message: str) -> Response:
    kind = "upstream_error" if status >= 500 else "invalid_request_error"
    return openai_error(status, message, kind, TRANSLATION_FAILED if status == 502 else None)


def _answer_bytes(
    back: Callable[[dict[str, Any], dict[str, Any], str | None], dict[str, Any]],
    body: dict[str, Any],
    answer_id: str | None,
    parsed: dict[str, Any] | None,
    raw: bytes,
) -> bytes:
    """The chat answer `raw` (`parsed`, where the proxy parsed it already) translated back and written (a large one
    on a worker thread: `off_loop_if_large`)."""
    result = back(orjson.loads(raw) if parsed is None else parsed, body, answer_id)
    try:
        return orjson.dumps(result)
    except orjson.JSONEncodeError:  # what orjson does not write (an integer past 64 bits in tool arguments)
        return json.dumps(result, ensure_ascii=False).encode()


async def _translated(
    proxy: LLMProxy, request: Request, rollout_id: str, attempt_id: str, api: TranslatedAPI
) -> Response:
    raw = await request.body()
    try:
        parsed = await off_loop_if_large(api.parse, raw)
    except Exception as exc:  # a request no check foresaw: the agent's to fix, never a 500
        parsed = untranslatable(exc)
    if isinstance(parsed, str):
        return api.refuse(400, parsed)
    body, chat = parsed
    if api.route == "responses" and body.get("previous_response_id"):
        earlier = await earlier_turn(proxy, rollout_id, attempt_id, body["previous_response_id"])
        if earlier is None:
            return JSONResponse(responses_api.not_found(str(body["previous_response_id"])), status_code=400)
        messages = earlier.request.get("messages")
        chat = {
            **chat,
            "messages": responses_api.continued(
                messages if isinstance(messages, list) else [],
                earlier.response_message,
                chat["messages"],
                instructions=bool(body.get("instructions")),
            ),
        }
    streamed = bool(body.get("stream"))
    if streamed:
        chat = {**chat, "stream": True, "stream_options": {"include_usage": True}}  # usage ends the API's stream
    answer = await proxy.answer_chat(
        chat,
        request,
        rollout_id,
        attempt_id,
        route=api.route,
        client_stream=streamed,
        heavy=len(raw) > OFF_LOOP_BYTES,
    )
    if answer.status_code != 200:
        return _reenveloped(answer, api.refuse) if api.route == "messages" else answer
    headers = {k: v for k, v in answer.headers.items() if k == attr.HEADER_LLM_SEQ}
    answer_id = None  # the API's own new id
    if api.route == "responses":  # the answer's id names this call: a later turn may continue from it
        seq = answer.rec.seq if isinstance(answer, RelayResponse) else headers.get(attr.HEADER_LLM_SEQ)
        if seq is not None:
            answer_id = responses_api.response_id(attempt_id, int(seq))
    if isinstance(answer, RelayResponse):
        # the proxy's own streamed response, so its record still learns when the agent hangs up; only its bytes
        # are translated on their way out
        relayed = cast(AsyncGenerator[bytes, None], answer.body_iterator)  # the proxy's relay, an async generator
        answer.body_iterator = _translated_stream(proxy, answer.rec, relayed, api.stream(body, answer_id))
        return answer
    try:
        given = answer.answer if isinstance(answer, AnsweredResponse) else None  # the proxy's parse, not a second
        back = partial(_answer_bytes, api.back, body, answer_id, given)
        translated = await off_loop_if_large(back, bytes(answer.body))
    except Exception as exc:
        # the call is stored as answered, but this agent gets no answer from it: not a sample of its policy
        why = f"the model server's answer could not be translated to the {api.route} API: {type(exc).__name__}: {exc}"
        log.exception("%s", why)
        await _not_received(proxy, attempt_id, headers.get(attr.HEADER_LLM_SEQ), why)
        refused = api.refuse(502, why)
        refused.headers.update(headers)
        return refused
    return Response(translated, media_type="application/json", headers=headers)


async def earlier_turn(proxy: LLMProxy, rollout_id: str, attempt_id: str, previous: Any) -> LLMCall | None:
    """The call of this attempt whose answer `previous` (a `previous_response_id`) names, answered; else None."""
    seq = responses_api.named_call(previous, attempt_id)
    if seq is None:
        return None
    calls = await asyncio.to_thread(proxy.store.llm_calls, rollout_id, attempt_id)
    return next((c for c in calls if c.seq == seq and c.status == "ok" and c.response_message), None)


async def _not_received(proxy: LLMProxy, attempt_id: str, seq: str | None, why: str) -> None:
    """Mark a stored call the agent did not receive as not trainable (with the store's mark for a call whose agent
    hung up), committed before the agent hears of it."""
    if seq is None:
        return
    try:
        marked = proxy.store.mark_llm_call_abandoned(attempt_id, int(seq), f"not received: {why}", http_status=502)
        await asyncio.wrap_future(marked)
    except Exception:
        log.exception("could not mark LLM call %s/%s as not received", attempt_id, seq)


def _events_of(translator: StreamTranslator, raw: bytes) -> bytes:
    """Whole chat SSE events (`raw` ends with the blank line of its last) as the translated API's events."""
    out: list[bytes] = []
    for event in raw.split(b"\n\n"):
        for line in event.split(b"\n"):
            if translator.finished or not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                out += translator.done()
                continue
            try:
                chunk = orjson.loads(data)
            except orjson.JSONDecodeError:
                continue  # the relay notes it on the call's record: not trainable
            if not isinstance(chunk, dict):
                continue
            if "error" in chunk:  # a backend's failure mid-stream (the relay stores it so)
                out.append(translator.error(502, error_message(chunk, data, 502)))
            else:
                out += translator.chunk(chunk)
    return b"".join(out)


async def _translated_stream(
    proxy: LLMProxy, rec: CallRecord, inner: AsyncGenerator[bytes, None], translator: StreamTranslator
) -> AsyncIterator[bytes]:
    """The relay's chat SSE bytes as the API's events, each chat event translated as it arrives. The relay stores
    the call (before it passes on [DONE], so before the API's final events); a translation that fails ends the
    stream with the API's error event and marks the call not trainable."""
    pending = bytearray()
    failed: str | None = None
    try:
        try:
            async for piece in inner:
                if translator.finished:
                    continue  # what follows the API's last event is not sent
                searched = max(len(pending) - 1, 0)  # each byte searched once: a large event comes in many pieces
                pending += piece
                end = pending.rfind(b"\n\n", searched)
                if end < 0:
                    continue
                whole = bytes(pending[: end + 2])
                del pending[: end + 2]
                try:
                    translate = partial(_events_of, translator, whole)
                    if len(whole) + translator.held_bytes > OFF_LOOP_BYTES:  # a large event, or a block's end
                        out = await heavy_lane(translate)
                    else:
                        out = translate()
                except Exception as exc:
                    failed = f"the model server's stream could not be translated: {type(exc).__name__}: {exc}"
                    log.exception("%s", failed)
                    break
                if out:
                    yield out
        except Exception as exc:  # the relay has stored the call with why its stream failed
            if not translator.finished:
                yield translator.error(502, f"the model server's stream failed: {type(exc).__name__}: {exc}")
            return
        if failed is not None:
            await inner.aclose()  # stores the call if [DONE] had not come yet
            await _not_received(proxy, rec.attempt_id, str(rec.seq), failed)
            yield translator.error(502, failed)
        elif not translator.finished:
            yield translator.error(502, rec.error or "the model server's stream ended before its end")
        elif translator.unreceived is not None:
            await _not_received(proxy, rec.attempt_id, str(rec.seq), translator.unreceived)
    finally:
        await inner.aclose()


def _reenveloped(answer: Response, refuse: Callable[[int, str], Response]) -> Response:
    """The chat path's error (OpenAI's envelope) in the envelope of the API the agent called, same status."""
    try:
        message = str(orjson.loads(bytes(answer.body))["error"]["message"])
    except (ValueError, KeyError, TypeError):
        message = bytes(answer.body).decode(errors="replace")[:2000]
    response = refuse(answer.status_code, message)
    for key, value in answer.headers.items():
        if key.lower() in ("retry-after", attr.HEADER_LLM_SEQ):
            response.headers[key] = value
    return response
