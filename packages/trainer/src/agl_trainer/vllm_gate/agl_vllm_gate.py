"""A key on every route of a vLLM server agl starts: `vllm serve ... --middleware agl_vllm_gate.EngineKeyGate`,
with this folder on the server's PYTHONPATH and the key in `AGL_ENGINE_KEY`.

vLLM's own `--api-key` guards only the paths under `/v1`, `/v2`, `/inference` and `/cohere`
(`vllm/entrypoints/serve/middleware/authenticate.py`, `GUARDED_PREFIX`): the development routes agl needs for
colocation and full fine-tuning (`/sleep`, `/wake_up`, `/collective_rpc`, `/reset_prefix_cache`) stay open to anyone
who reaches the port, and on a cluster each node's server listens on the node's address. This gate asks for
`Authorization: Bearer <key>` on every path but the liveness probes, for HTTP and WebSocket alike.

vLLM adds a `--middleware` class with `app.add_middleware(cls)`, no arguments
(`vllm/entrypoints/serve/middleware/register.py`), hence the key from the environment; a gate without one refuses
to start rather than let every request through. It runs in vLLM's environment: standard library only, no agl import.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from typing import Any

KEY_ENV = "AGL_ENGINE_KEY"
OPEN_PATHS = frozenset({"/health", "/ping"})  # liveness probes: they answer nothing but "up"


class EngineKeyGate:
    def __init__(self, app: Any) -> None:
        key = os.environ.get(KEY_ENV, "")
        if not key:
            raise RuntimeError(f"agl_vllm_gate.EngineKeyGate needs the engine key in ${KEY_ENV}; it is unset")
        self.app = app
        self._digest = hashlib.sha256(key.encode()).digest()

    def allowed(self, scope: dict[str, Any]) -> bool:
        if scope.get("path", "") in OPEN_PATHS:
            return True
        for name, value in scope.get("headers", ()):
            if name.lower() == b"authorization":
                scheme, _, given = value.partition(b" ")
                # compared as digests: equal length whatever was sent, so the comparison's time tells nothing
                return scheme.lower() == b"bearer" and hmac.compare_digest(
                    hashlib.sha256(given.strip()).digest(), self._digest
                )
        return False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket") or self.allowed(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # policy violation
            return
        body = json.dumps({"error": {"message": "this engine needs the run's key", "type": "unauthorized"}}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})
