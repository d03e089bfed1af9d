"""The proxy's APIs served through chat completions: OpenAI's Responses API (agl.server.responses) and Anthropic's
Messages API (agl.server.anthropic_messages). Each request is parsed and checked (off the event loop when large),
translated, answered and recorded by the proxy's chat path under its own route, and the answer translated back,
streamed as that API's events when the client asked for a stream."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from agl.common import attributes as attr
from agl.server import anthropic_messages as messages_api
from agl.server import responses as responses_api
from agl.server.call_record import (
    MAX_JSON_DEPTH,
    MAX_REQUEST_STRUCTURES,
    OFF_LOOP_BYTES,
    off_loop_if_large,
    request_problem,
    structure_problem,
    too_deep,
    unstorable,
)
from agl.server.proxy import LLMProxy, openai_error


def parsed_object(raw: bytes, max_structures: int) -> dict[str, Any] | str:
    """A translated API's request body, parsed and checked before its translation (the answer echoes parts of the
    request): the object, or why it is refused."""
    if (dense := structure_problem(raw, max_structures)) is not None:
        return dense
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return f"request body is not valid JSON: {exc}"
    if not isinstance(body, dict):
        return "the request body must be a JSON object"
    if len(raw) > OFF_LOOP_BYTES and (deep := unstorable(body)) is not None:
        return deep
    if len(raw) <= OFF_LOOP_BYTES and too_deep(body):
        return f"request body nests lists and objects more than {MAX_JSON_DEPTH} levels deep"
    return body


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
    problem = request_problem(chat)
    return problem if problem is not None else (body, chat)


async def responses(proxy: LLMProxy, request: Request, rollout_id: str, attempt_id: str) -> Response:
    """The Responses API (agl.server.responses says why through chat completions); errors in the OpenAI envelope,
    which that API uses too."""
    parse = partial(parse_responses, max_structures=proxy.upstream.max_request_structures)
    return await _translated(
        proxy,
        request,
        rollout_id,
        attempt_id,
        route="responses",
        parse=parse,
        back=responses_api.from_chat,
        events=responses_api.stream_events,
        refuse=lambda status, message: openai_error(status, message, "invalid_request_error"),
    )


async def messages(proxy: LLMProxy, request: Request, rollout_id: str, attempt_id: str) -> Response:
    """Anthropic's Messages API (agl.server.anthropic_messages); errors in Anthropic's envelope."""
    return await _translated(
        proxy,
        request,
        rollout_id,
        attempt_id,
        route="messages",
        parse=partial(parse_messages, max_structures=proxy.upstream.max_request_structures),
        back=messages_api.from_chat,
        events=messages_api.stream_events,
        refuse=anthropic_error,
    )


def anthropic_error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return Response(
        messages_api.error_body(status, message), status_code=status, media_type="application/json", headers=headers
    )


async def _translated(
    proxy: LLMProxy,
    request: Request,
    rollout_id: str,
    attempt_id: str,
    *,
    route: str,
    parse: Callable[[bytes], tuple[dict[str, Any], dict[str, Any]] | str],
    back: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]],
    events: Callable[[dict[str, Any]], Iterator[bytes]],
    refuse: Callable[[int, str], Response],
) -> Response:
    raw = await request.body()
    parsed = await off_loop_if_large(parse, raw)
    if isinstance(parsed, str):
        return refuse(400, parsed)
    body, chat = parsed
    answer = await proxy.answer_chat(
        chat,
        request,
        rollout_id,
        attempt_id,
        route=route,
        client_stream=bool(body.get("stream")),
        heavy=len(raw) > OFF_LOOP_BYTES,
    )
    if answer.status_code != 200:
        return _reenveloped(answer, refuse) if route == "messages" else answer
    result = back(orjson.loads(bytes(answer.body)), body)
    headers = {k: v for k, v in answer.headers.items() if k == attr.HEADER_LLM_SEQ}
    if body.get("stream"):
        return StreamingResponse(iter(list(events(result))), media_type="text/event-stream", headers=headers)
    return Response(orjson.dumps(result), media_type="application/json", headers=headers)


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
