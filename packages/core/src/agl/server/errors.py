"""The server's error answers: the OpenAI-style envelope, validation errors in one line, the 404 of an unknown LLM
route, and the error answers each route documents in the OpenAPI schema."""

from __future__ import annotations

import re
from collections.abc import MutableMapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel
from starlette.responses import JSONResponse, Response

from agl.protocol import error_body, error_bytes


def openai_error(status: int, message: str, type_: str, code: str | None = None) -> Response:
    """An error in OpenAI's envelope (the LLM proxy's answers)."""
    return Response(error_bytes(message, type_, code), status_code=status, media_type="application/json")


def error_response(status: int, message: str, type_: str) -> JSONResponse:
    return JSONResponse(error_body(message, type_), status_code=status)


def describe_validation(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        if err.get("type") == "json_invalid":
            ctx = err.get("ctx") or {}
            parts.append(f"request body is not valid JSON ({ctx.get('error', err.get('msg'))})")
        else:
            parts.append(f"{loc or 'body'}: {err.get('msg')}")
    return "; ".join(parts) or "invalid request"


LLM_ROUTES = (
    "POST /v1/chat/completions",
    "POST /v1/responses",
    "POST /v1/messages (Anthropic's Messages API)",
    "POST /v1/messages/count_tokens",
    "GET /v1/models",
    "(each also under /rollout/{rollout_id}/attempt/{attempt_id}/v1/...)",
)


# the LLM routes under `.../v1/`, and the one method each takes (a known route asked with another gets 405)
_LLM_METHODS = {
    "chat/completions": "POST",
    "responses": "POST",
    "messages": "POST",
    "messages/count_tokens": "POST",
    "models": "GET",
}


def unknown_llm_route(request: Request) -> Response:
    rest = request.path_params.get("rest", "").strip("/")
    allowed = _LLM_METHODS.get(rest)
    if rest == "traces" and not request.url.path.startswith("/rollout/"):
        allowed = "POST"  # the OTLP receiver, beside the fixed LLM routes
    if allowed is not None and request.method != allowed:
        return method_not_allowed(request, [allowed])
    message = f"agl's LLM proxy does not serve {request.method} {request.url.path}; it serves: {'; '.join(LLM_ROUTES)}"
    return JSONResponse(error_body(message, "invalid_request_error", "unknown_route"), status_code=404)


def method_not_allowed(request: Request, methods: list[str]) -> Response:
    allow = ", ".join(sorted(methods))
    message = f"{request.method} is not allowed on {request.url.path}: it takes {allow}"
    return JSONResponse(
        error_body(message, "invalid_request_error", "method_not_allowed"), status_code=405, headers={"allow": allow}
    )


def allowed_methods(app: FastAPI, scope: MutableMapping[str, Any]) -> list[str]:
    """The methods this path takes: those of its most specific routes (fewest path parameters). Starlette's own 405
    names only the first route whose path matches, and `/rollouts/details` is also `/rollouts/{rollout_id}`."""
    from starlette.routing import Match

    matching: dict[int, set[str]] = {}
    for route in app.router.routes:
        route_methods = getattr(route, "methods", None)
        if route_methods and route.matches(scope)[0] != Match.NONE:
            matching.setdefault(len(getattr(route, "param_convertors", {})), set()).update(route_methods)
    return sorted(matching[min(matching)]) if matching else []


_CHAT = re.compile(r"^/rollout/[^/]+/attempt/[^/]+/v1/chat/completions/?$")


def takes_post(app: FastAPI) -> Any:
    """A test of whether a documented route takes POST at a request's path (the content-type guard applies to
    those only: any other POST is answered 405 or 404 unread)."""
    from fastapi.routing import APIRoute
    from starlette.routing import Match

    routes = [
        r for r in app.router.routes if isinstance(r, APIRoute) and r.include_in_schema and "POST" in (r.methods or ())
    ]

    def test(scope: dict[str, Any]) -> bool:
        if _CHAT.match(scope["path"]):  # the proxy's hot path, without a walk over every route
            return True
        return any(r.matches(scope)[0] == Match.FULL for r in routes)

    return test


class ErrorBody(BaseModel):
    """Every error agl's server gives has this OpenAI-style shape."""

    error: dict[str, Any]


_ANSWERS = {
    400: "bad input: the message says which part (an unknown Host, invalid JSON or gzip, a bad value)",
    401: "missing or wrong bearer token (servers started with --token)",
    403: "a cross-site request, or an attempt's credential used beyond its own attempt (an LLM-only credential on"
    " anything but its attempt's LLM routes)",
    404: "the rollout, attempt or task does not exist",
    409: "the attempt or rollout is in a state that refuses this (ended, taken over, cancelled); LLM calls still "
    "in flight when a hold's drain time ran out",
    413: "the body (or what it inflates to) is over --max-body-mb",
    415: "wrong content type or encoding",
    422: "a field failed validation: the message names it",
    431: "the request line and headers are over --max-header-kb",
    502: "the LLM backend could not be reached, or gave an answer that is not a valid one (stored with the error)",
    503: "no LLM backend configured (agl serve without --upstream), or the store takes no writes",
}
# Answers beyond the common 400/401/403/413/415/422/431, by path
_EXTRA = {
    "/api/v1/tasks": (409,),
    "/api/v1/tasks/{task_id}": (404,),
    "/api/v1/rollouts/{rollout_id}": (404,),
    "/api/v1/rollouts/{rollout_id}/detail": (404,),
    "/api/v1/rollouts/{rollout_id}/cancel": (404,),
    "/api/v1/rollouts": (404, 409),
    "/api/v1/attempts/{attempt_id}/heartbeat": (404, 409),
    "/api/v1/attempts/{attempt_id}/complete": (404, 409),
    "/api/v1/rewards": (404, 409),
    "/api/v1/spans": (404, 409),
    "/v1/traces": (404, 409),
    "/rollout/{rollout_id}/attempt/{attempt_id}/v1/chat/completions": (404, 409, 502, 503),
    "/rollout/{rollout_id}/attempt/{attempt_id}/v1/responses": (404, 409, 502, 503),
    "/api/v1/proxy/hold": (409,),
    "/api/v1/proxy/engines/remove": (404,),
}


def document_errors(app: FastAPI) -> None:
    """List in the OpenAPI document the error answers each route gives, with their shape."""
    from fastapi.routing import APIRoute

    for route in app.routes:
        if isinstance(route, APIRoute):
            for code in (400, 401, 403, 413, 415, 422, 431, *_EXTRA.get(route.path, ())):
                route.responses.setdefault(code, {"model": ErrorBody, "description": _ANSWERS[code]})
