"""agl's gate on the vLLM servers it starts (agl_trainer/vllm_gate/agl_vllm_gate.py), on a small Starlette app
shaped like vLLM's (its development routes beside /v1): every route but the liveness probe asks for the key. The
same gate on a real vLLM server: tests/test_vllm_engine.py::test_every_route_of_the_runs_server_asks_for_its_key."""

from __future__ import annotations

import importlib.util
from types import ModuleType
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.testclient import TestClient
from starlette.websockets import WebSocket, WebSocketDisconnect

from agl_trainer.engines.vllm_server import GATE_KEY_ENV, GATE_MIDDLEWARE, GATE_PATH

KEY = "the-runs-key"


def gate_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("agl_vllm_gate", GATE_PATH / "agl_vllm_gate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def vllm_shaped_app(gate: Any) -> Starlette:
    async def ok(request: object) -> JSONResponse:
        return JSONResponse({"ok": True})

    async def stream(ws: WebSocket) -> None:
        await ws.accept()
        await ws.send_text("hello")
        await ws.close()

    paths = ["/health", "/v1/models", "/sleep", "/wake_up", "/collective_rpc", "/reset_prefix_cache", "/tokenize"]
    app = Starlette(
        routes=[*(Route(p, ok, methods=["GET", "POST"]) for p in paths), WebSocketRoute("/v1/realtime", stream)]
    )
    app.add_middleware(gate)  # as vLLM adds a --middleware class: no arguments
    return app


def test_every_route_but_health_needs_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(GATE_KEY_ENV, KEY)
    module = gate_module()
    assert f"{module.__name__}.{module.EngineKeyGate.__name__}" == GATE_MIDDLEWARE
    assert module.KEY_ENV == GATE_KEY_ENV
    client = TestClient(vllm_shaped_app(module.EngineKeyGate))
    for path in ("/v1/models", "/sleep?level=1", "/wake_up", "/collective_rpc", "/reset_prefix_cache", "/tokenize"):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {"Authorization": "Basic x"}):
            resp = client.post(path, headers=headers)
            assert resp.status_code == 401, (path, headers)
            assert "key" in resp.json()["error"]["message"]
        assert client.post(path, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200, path
        assert client.post(path, headers={"authorization": f"bearer {KEY}"}).status_code == 200, path
    assert client.get("/health").status_code == 200
    with pytest.raises(WebSocketDisconnect), client.websocket_connect("/v1/realtime") as ws:
        ws.receive_text()
    with client.websocket_connect("/v1/realtime", headers={"Authorization": f"Bearer {KEY}"}) as ws:
        assert ws.receive_text() == "hello"


def test_a_gate_without_a_key_refuses_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(GATE_KEY_ENV, raising=False)
    client = TestClient(vllm_shaped_app(gate_module().EngineKeyGate))
    with pytest.raises(RuntimeError, match=GATE_KEY_ENV):
        client.get("/health")
