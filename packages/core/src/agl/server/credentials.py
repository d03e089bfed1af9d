"""Credentials scoped to one attempt: what an agent gets as its API key when the server has a token.

The operator token opens everything; an agent only needs its own rollout (the proxy, its rewards, spans and
completion). So each claim hands the attempt a credential `agl-attempt.<attempt id>.<MAC>`, the attempt id
authenticated with the operator token as key: nothing to store, and it cannot be forged for another attempt
without the token.
"""

from __future__ import annotations

import hashlib
import hmac
import re

PREFIX = "agl-attempt."
_SHAPE = re.compile(rb"^agl-attempt\.([A-Za-z0-9_-]{1,200})\.([0-9a-f]{64})$")


def attempt_credential(secret: str, attempt_id: str) -> str:
    return f"{PREFIX}{attempt_id}.{_mac(secret, attempt_id)}"


def attempt_of(secret: str, credential: bytes) -> str | None:
    """The attempt a credential was made for, or None if it is not a valid attempt credential."""
    match = _SHAPE.match(credential)
    if match is None:
        return None
    attempt_id = match[1].decode()
    if not hmac.compare_digest(match[2].decode(), _mac(secret, attempt_id)):
        return None
    return attempt_id


def _mac(secret: str, attempt_id: str) -> str:
    return hmac.new(secret.encode(), b"agl-attempt:" + attempt_id.encode(), hashlib.sha256).hexdigest()


# Routes an attempt credential opens, besides its own proxy URL: reports about its own attempt. The route
# handlers check that what is reported (rewards, spans) belongs to that attempt.
_OWN_ATTEMPT = re.compile(r"^/api/v1/attempts/([^/]+)/(heartbeat|complete)$")
_PROXY = re.compile(r"^/rollout/[^/]+/attempt/([^/]+)/v1/")
_REPORTS = frozenset({"/api/v1/rewards", "/api/v1/spans", "/v1/traces"})


def attempt_may(attempt_id: str, method: str, path: str) -> bool:
    """Whether the credential of `attempt_id` opens `method path`."""
    for pattern in (_PROXY, _OWN_ATTEMPT):
        match = pattern.match(path)
        if match is not None:
            return match[1] == attempt_id
    return method == "POST" and path in _REPORTS
