"""Anthropic's token-counting route, `POST /v1/messages/count_tokens`: the prompt a Messages request would make,
counted by the model server's own tokenizer and chat template (vLLM's `/tokenize`, at its root), so a client that
sizes its context (Claude Code's compaction) gets the count of the tokens the trained model will see. Nothing is
stored: counting is not a model call."""

from __future__ import annotations

from functools import partial
from typing import Any

import aiohttp
import orjson
from starlette.requests import Request
from starlette.responses import Response

from agl.server import anthropic_messages as messages_api
from agl.server.call_record import off_loop_if_large
from agl.server.proxy import UPSTREAM_ERRORS, LLMProxy
from agl.server.relay import BadAnswer, read_capped
from agl.server.request_cost import MAX_REQUEST_STRUCTURES
from agl.server.translated_apis import anthropic_error, parsed_object, untranslatable


def parse_count_request(raw: bytes, max_structures: int = MAX_REQUEST_STRUCTURES) -> dict[str, Any] | str:
    """The chat request whose prompt is counted (a Messages request needs no max_tokens here), or why not."""
    body = parsed_object(raw, max_structures)
    if isinstance(body, str):
        return body
    try:
        return messages_api.to_chat({**body, "max_tokens": 1})
    except messages_api.MessagesRequestError as exc:
        return str(exc)
    except Exception as exc:  # a request no check foresaw: the agent's to fix, never a 500
        return untranslatable(exc)


async def count_tokens(proxy: LLMProxy, request: Request, attempt_id: str) -> Response:
    raw = await request.body()
    parse = partial(parse_count_request, max_structures=proxy.upstream.max_request_structures)
    try:
        chat = await off_loop_if_large(parse, raw)
    except Exception as exc:  # a request no check foresaw: the agent's to fix, never a 500
        chat = untranslatable(exc)
    if isinstance(chat, str):
        return anthropic_error(400, chat)
    engine = proxy.engines.pick(attempt_id)
    if engine is None:
        return anthropic_error(503, "no model server is in rotation behind agl to count tokens with")
    payload: dict[str, Any] = {"model": await proxy.upstream_model_for(chat.get("model")), "messages": chat["messages"]}
    if chat.get("tools"):
        payload["tools"] = chat["tools"]
    url = f"{engine.url.rstrip('/').removesuffix('/v1')}/tokenize"
    headers = {"content-type": "application/json"}
    if proxy.upstream.api_key:
        headers["authorization"] = f"Bearer {proxy.upstream.api_key}"
    try:
        timeout = aiohttp.ClientTimeout(total=proxy.upstream.timeout_s)
        async with proxy.http().post(
            url, data=orjson.dumps(payload), headers=headers, timeout=timeout, allow_redirects=False
        ) as resp:
            content = await read_capped(resp, proxy.upstream.max_answer_bytes)
            status = resp.status
    except (*UPSTREAM_ERRORS, BadAnswer) as exc:
        return anthropic_error(502, f"the model server did not count the tokens: {type(exc).__name__}: {exc}")
    if status == 404:
        return anthropic_error(
            404,
            "the model server behind agl counts no tokens (it has no /tokenize route, which vLLM serves): "
            "count_tokens is not available with this upstream",
        )
    try:
        count = orjson.loads(content)["count"] if status == 200 else None
    except (ValueError, KeyError, TypeError):
        count = None
    if not isinstance(count, int):
        return anthropic_error(502, f"the model server answered /tokenize with HTTP {status} and no count")
    return Response(orjson.dumps({"input_tokens": count}), media_type="application/json")
