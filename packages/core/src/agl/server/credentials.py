"""Credentials scoped to one attempt, for a server with a token: nothing to store, and none can be forged for
another attempt without the token.

The operator token opens everything. A claim hands the worker two credentials for the attempt it starts, each the
attempt id authenticated with the operator token as key, in a MAC domain of its own (so that one cannot be turned
into the other):

- `agl-llm.<attempt id>.<MAC>`, the **LLM credential**: what the agent's code and every program it runs get as
  their API key. It opens that attempt's LLM routes (`/rollout/R/attempt/A/v1/...`, which the fixed URL and the
  URL naming an agent become before any guard looks) and nothing else: no rewards, spans, traces, heartbeat,
  completion, engines or holds. What an agent runs cannot grade itself or end its attempt with it.
- `agl-attempt.<attempt id>.<MAC>`, the **attempt credential**: that attempt's LLM routes and its own reports
  (rewards, spans, heartbeat, completion). Still accepted for what it opened before the LLM credential existed;
  agl no longer hands it to agent code.
"""

from __future__ import annotations

import hashlib
import hmac
import re

PREFIX = "agl-attempt."
LLM_PREFIX = "agl-llm."
_SHAPE = re.compile(rb"^agl-attempt\.([A-Za-z0-9_-]{1,200})\.([0-9a-f]{64})$")
_LLM_SHAPE = re.compile(rb"^agl-llm\.([A-Za-z0-9_-]{1,200})\.([0-9a-f]{64})$")
_ATTEMPT_DOMAIN = b"agl-attempt:"
_LLM_DOMAIN = b"agl-llm:"


def attempt_credential(secret: str, attempt_id: str) -> str:
    return f"{PREFIX}{attempt_id}.{_mac(secret, _ATTEMPT_DOMAIN, attempt_id)}"


def llm_credential(secret: str, attempt_id: str) -> str:
    """The credential that opens only `attempt_id`'s LLM routes (see the module's docstring)."""
    return f"{LLM_PREFIX}{attempt_id}.{_mac(secret, _LLM_DOMAIN, attempt_id)}"


def attempt_of(secret: str, credential: bytes) -> str | None:
    """The attempt an attempt credential was made for, or None if it is not a valid attempt credential."""
    return _verified(secret, _SHAPE, _ATTEMPT_DOMAIN, credential)


def llm_attempt_of(secret: str, credential: bytes) -> str | None:
    """The attempt an LLM credential was made for, or None if it is not a valid LLM credential."""
    return _verified(secret, _LLM_SHAPE, _LLM_DOMAIN, credential)


def _verified(secret: str, shape: re.Pattern[bytes], domain: bytes, credential: bytes) -> str | None:
    match = shape.match(credential)
    if match is None:
        return None
    attempt_id = match[1].decode()
    if not hmac.compare_digest(match[2].decode(), _mac(secret, domain, attempt_id)):
        return None
    return attempt_id


def _mac(secret: str, domain: bytes, attempt_id: str) -> str:
    return hmac.new(secret.encode(), domain + attempt_id.encode(), hashlib.sha256).hexdigest()


# Routes an attempt credential opens, besides its own proxy URL: reports about its own attempt. The route
# handlers check that what is reported (rewards, spans) belongs to that attempt.
_OWN_ATTEMPT = re.compile(r"^/api/v1/attempts/([^/]+)/(heartbeat|complete)$")
_PROXY = re.compile(r"^/rollout/[^/]+/attempt/([^/]+)/v1/")
_REPORTS = frozenset({"/api/v1/rewards", "/api/v1/spans", "/v1/traces"})


def attempt_may(attempt_id: str, method: str, path: str) -> bool:
    """Whether the attempt credential of `attempt_id` opens `method path`."""
    for pattern in (_PROXY, _OWN_ATTEMPT):
        match = pattern.match(path)
        if match is not None:
            return match[1] == attempt_id
    return method == "POST" and path in _REPORTS


def llm_may(attempt_id: str, path: str) -> bool:
    """Whether the LLM credential of `attempt_id` opens `path`: that attempt's LLM routes, nothing else."""
    match = _PROXY.match(path)
    return match is not None and match[1] == attempt_id
