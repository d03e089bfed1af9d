"""The server's error answers: the OpenAI-style envelope, validation errors in one line, the 404 of an unknown LLM
route, and the error answers each route documents in the OpenAPI schema."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel
from starlette.responses import JSONResponse, Response

from agl.protocol import error_body


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
    "GET /v1/models",
    "(each also under /rollout/{rollout_id}/attempt/{attempt_id}/v1/...)",
)


def unknown_llm_route(request: Request) -> Response:
    message = f"agl's LLM proxy does not serve {request.method} {request.url.path}; it serves: {'; '.join(LLM_ROUTES)}"
    return JSONResponse(error_body(message, "invalid_request_error", "unknown_route"), status_code=404)


class ErrorBody(BaseModel):
    """Every error agl's server gives has this OpenAI-style shape."""

    error: dict[str, Any]


_ANSWERS = {
    400: "bad input: the message says which part (an unknown Host, invalid JSON or gzip, a bad value)",
    401: "missing or wrong bearer token (servers started with --token)",
    403: "a cross-site request, or an attempt's credential used beyond its own attempt",
    404: "the rollout, attempt or task does not exist",
    409: "the attempt or rollout is in a state that refuses this (ended, taken over, cancelled); LLM calls still "
    "in flight when a hold's drain time ran out",
    413: "the body (or what it inflates to) is over --max-body-mb",
    415: "wrong content type or encoding",
    422: "a field failed validation: the message names it",
}
# Answers beyond the common 400/401/403/413/415/422, by path
_EXTRA = {
    "/api/v1/tasks/{task_id}": (404,),
    "/api/v1/rollouts/{rollout_id}": (404,),
    "/api/v1/rollouts/{rollout_id}/detail": (404,),
    "/api/v1/rollouts/{rollout_id}/cancel": (404,),
    "/api/v1/rollouts": (404,),
    "/api/v1/attempts/{attempt_id}/heartbeat": (404, 409),
    "/api/v1/attempts/{attempt_id}/complete": (404, 409),
    "/api/v1/rewards": (404, 409),
    "/api/v1/spans": (404,),
    "/rollout/{rollout_id}/attempt/{attempt_id}/v1/chat/completions": (404, 409),
    "/api/v1/proxy/hold": (409,),
}


def document_errors(app: FastAPI) -> None:
    """List in the OpenAPI document the error answers each route gives, with their shape."""
    from fastapi.routing import APIRoute

    for route in app.routes:
        if isinstance(route, APIRoute):
            for code in (400, 401, 403, 413, 415, 422, *_EXTRA.get(route.path, ())):
                route.responses.setdefault(code, {"model": ErrorBody, "description": _ANSWERS[code]})
