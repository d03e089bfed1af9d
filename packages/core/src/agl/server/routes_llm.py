"""The LLM proxy's routes: an attempt's OpenAI-compatible chat completions, responses and models, Anthropic's messages, the run's fixed
models route, and a 404 that names what the proxy serves for any other OpenAI route. `ProxyFastPath` sends chat
completions to the proxy ahead of FastAPI."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from starlette.responses import Response

from agl.server import token_count, translated_apis
from agl.server.errors import unknown_llm_route
from agl.server.proxy import LLMProxy

if TYPE_CHECKING:
    from agl.server.context import ServerContext

_CHAT_PATH = re.compile(r"^/rollout/([^/]+)/attempt/([^/]+)/v1/chat/completions/?$")
_ANY_METHOD = ["GET", "POST", "PUT", "PATCH", "DELETE"]


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


def add_routes(app: FastAPI, server: ServerContext) -> None:
    """Registered after every other `/v1/...` route: the catch-alls here would answer those otherwise."""
    proxy = server.proxy

    @app.post("/rollout/{rollout_id}/attempt/{attempt_id}/v1/chat/completions", tags=["llm proxy"])
    async def chat(rollout_id: str, attempt_id: str, request: Request) -> Response:
        return await proxy.chat_completions(request, rollout_id, attempt_id)

    @app.post("/rollout/{rollout_id}/attempt/{attempt_id}/v1/responses", tags=["llm proxy"])
    async def responses(rollout_id: str, attempt_id: str, request: Request) -> Response:
        return await translated_apis.responses(proxy, request, rollout_id, attempt_id)

    @app.post("/rollout/{rollout_id}/attempt/{attempt_id}/v1/messages", tags=["llm proxy"])
    async def messages(rollout_id: str, attempt_id: str, request: Request) -> Response:
        """Anthropic's Messages API, served through chat completions (agl.server.anthropic_messages)."""
        return await translated_apis.messages(proxy, request, rollout_id, attempt_id)

    @app.post("/rollout/{rollout_id}/attempt/{attempt_id}/v1/messages/count_tokens", tags=["llm proxy"])
    async def count_tokens(rollout_id: str, attempt_id: str, request: Request) -> Response:
        """Anthropic's token counting: the Messages request's prompt counted by the model server (its /tokenize)."""
        return await token_count.count_tokens(proxy, request, attempt_id)

    @app.get("/rollout/{rollout_id}/attempt/{attempt_id}/v1/models", tags=["llm proxy"])
    async def rollout_models(rollout_id: str, attempt_id: str) -> Response:
        return proxy.models_response()

    @app.get("/v1/models", tags=["llm proxy"])
    async def models() -> Response:
        return proxy.models_response()

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
