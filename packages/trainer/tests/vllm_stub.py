"""A stand-in for vLLM's OpenAI server that records what agl asks of it: the routes agl calls around updates
(`/sleep`, `/wake_up`, `/collective_rpc`, `/reset_prefix_cache`, `/v1/load_lora_adapter`), in order, and the
weights a `reload_weights` points it at (read back from the safetensors files, as vLLM would). No model runs."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import orjson
import torch

from agl.asgi import ThreadedServer
from agl.testing.upstream import read_body, respond_json


class RecordingVllm:
    def __init__(self, events: list[str] | None = None) -> None:
        self.calls: list[str] = []  # "POST /sleep?level=1", ...
        self.events = events  # a log shared with other recorders, each entry prefixed "vllm: "
        self.weights: list[dict[str, torch.Tensor]] = []  # what each reload_weights read
        self.asleep = False
        self._lock = threading.Lock()
        self._server = ThreadedServer(self, lifespan="off", name="recording-vllm")
        self.root = self._server.url
        self.url = f"{self.root}/v1"

    def record(self, what: str) -> None:
        with self._lock:
            self.calls.append(what)
            if self.events is not None:
                self.events.append(f"vllm: {what}")

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        method, path = scope["method"], scope["path"]
        query = scope.get("query_string", b"").decode()
        answer: Any = {}
        if (method, path) == ("GET", "/v1/models"):
            answer = {"object": "list", "data": [{"id": "base", "object": "model", "parent": None}]}
        else:
            self.record(f"{method} {path}" + (f"?{query}" if query else ""))
            if path == "/sleep":
                self.asleep = True
            elif path == "/wake_up":
                self.asleep = False
            elif path == "/is_sleeping":
                answer = {"is_sleeping": self.asleep}
            elif path == "/collective_rpc":
                rpc = orjson.loads(body)
                if rpc.get("method") == "reload_weights":
                    self.weights.append(_read_weights(Path(rpc["kwargs"]["weights_path"])))
                answer = {"results": [None]}
            elif path == "/reset_prefix_cache":
                answer = {"success": True}
        await respond_json(send, 200, orjson.dumps(answer))

    def __enter__(self) -> RecordingVllm:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(file)))
    return out
