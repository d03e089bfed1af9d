"""Stand-ins for vLLM's OpenAI server where the real one cannot run here.

- `RecordingVllm` records what agl asks of it (`/sleep`, `/wake_up`, `/collective_rpc`, `/reset_prefix_cache`,
  `/v1/load_lora_adapter`), in order, and the weights a `reload_weights` points it at. No model runs.
- `SleepModeVllm` serves a real model (agl's embedded engine: exact token ids and log-probs at the request's
  temperature, LoRA adapters by name) and behaves as vLLM 0.32 documents and implements sleep mode, which needs
  CUDA (`CuMemAllocator`) and so cannot run on this machine. Each rule cites the vLLM source it follows (paths
  under `vllm/` of vllm 0.32.0, as `make vllm` installs it):

  * `POST /sleep?level=L` (`entrypoints/serve/dev/sleep/api_router.py`, `LLM.sleep`'s docstring in
    `entrypoints/llm.py`): the scheduler pauses and the prefix cache is cleared (`v1/engine/core.py`
    `EngineCore.sleep`: `pause_scheduler(clear_cache=level >= 1)`); level 1 offloads the weights to host memory
    and drops the KV cache, level 2 drops both (`device_allocator/sleep_mode_backend.py`
    `CuMemSleepModeBackend.suspend`: the "weights" tag is offloaded only at level 1).
  * `POST /wake_up[?tags=weights|kv_cache]` (no tag: all): the named allocations are mapped again
    (`Worker.wake_up`, `v1/worker/gpu_worker.py`); weights offloaded at level 1 come back as they were, weights
    discarded at level 2 come back as whatever the new memory holds (here: noise), so the server answers with wrong
    log-probs until `reload_weights` fills them. Scheduling resumes only once every allocation is resident again
    (`EngineCore.wake_up`: "Partial wakes intentionally keep the remaining allocations asleep").
  * Requests that arrive while the scheduler is paused are accepted and wait (vLLM queues them); here they wait
    `request_wait_s` at most and then get 503, so that a test that generates during a sleep fails instead of
    hanging.
  * `POST /collective_rpc` `reload_weights(weights_path=...)` (`GPUModelRunner.reload_weights`) loads the folder's
    safetensors in place and resets the LoRA state, not the prefix cache: KV blocks computed with the old weights
    stay until `POST /reset_prefix_cache`. Into weights that are not resident (asleep) it cannot load: 500.
  * `POST /v1/load_lora_adapter` while not fully awake: 500 (agl loads adapters after waking, as verl does).

Every request is recorded ("POST /wake_up?tags=weights", ...) in `calls`, and in `events` prefixed "vllm: ".
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import orjson
import torch

from agl.common.asgi import ThreadedServer
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


class SleepModeVllm:
    """vLLM's server in sleep mode around a real model (see the module's docstring for each rule and its source)."""

    TAGS = ("weights", "kv_cache")

    def __init__(
        self,
        model_dir: Path,
        events: list[str] | None = None,
        *,
        served_model: str = "base",
        request_wait_s: float = 20,
    ) -> None:
        from agl_trainer.engines.embedded import Engine
        from agl_trainer.engines.serving import create_app
        from agl_trainer.models import load_model

        model, tokenizer = load_model(model_dir, device="cpu")
        self.engine = Engine(model, tokenizer, max_batch=4, batch_window_s=0.01)
        self._inner = create_app(self.engine, served_model=served_model)
        self.calls: list[str] = []
        self.events = events
        self.request_wait_s = request_wait_s
        self.resident = {"weights": True, "kv_cache": True}
        self.paused = False
        self.discarded_weights = False  # woken after a level-2 sleep and not reloaded since: noise
        self.reloads: list[str] = []  # the folders reload_weights read
        self._host_copy: dict[str, torch.Tensor] | None = None  # level 1's offloaded weights
        self._lock = threading.Lock()
        self._server = ThreadedServer(self, lifespan="off", name="sleep-mode-vllm")
        self.root = self._server.url
        self.url = f"{self.root}/v1"

    # --------------------------------------------------------------------------------- the model's memory

    def _target(self) -> Any:
        model = self.engine.model
        return model.get_base_model() if hasattr(model, "get_base_model") else model

    def _sleep(self, level: int) -> None:
        with self.engine.lock:
            self.paused = True
            if level >= 1:
                self.engine.prefix_cache.clear()
                if self.resident["weights"]:
                    # level 1 offloads them (kept in host memory), level 2 lets them go
                    state = self.engine.model.state_dict()
                    self._host_copy = {k: v.detach().clone() for k, v in state.items()} if level == 1 else None
                self.resident = {"weights": False, "kv_cache": False}

    def _wake(self, tags: list[str]) -> None:
        with self.engine.lock:
            if "weights" in tags and not self.resident["weights"]:
                if self._host_copy is not None:
                    self.engine.model.load_state_dict(self._host_copy)
                    self._host_copy = None
                    self.discarded_weights = False
                else:  # new memory, never written: what a level-2 sleep leaves behind
                    generator = torch.Generator().manual_seed(len(self.calls))
                    with torch.no_grad():
                        for p in self.engine.model.parameters():
                            p.copy_(torch.randn(p.shape, generator=generator, dtype=p.dtype))
                    self.discarded_weights = True
                self.resident["weights"] = True
            if "kv_cache" in tags:
                self.resident["kv_cache"] = True
            if all(self.resident.values()):
                self.paused = False

    def _reload(self, folder: Path) -> None:
        from safetensors.torch import load_file

        state: dict[str, torch.Tensor] = {}
        for file in sorted(folder.glob("*.safetensors")):
            state.update(load_file(str(file)))
        if not state:
            raise ValueError(f"no safetensors in {folder}")
        with self.engine.lock, torch.no_grad():
            missing, unexpected = self._target().load_state_dict(state, strict=False)
            if unexpected or [m for m in missing if "rotary" not in m]:
                raise ValueError(
                    f"checkpoint does not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}"
                )
            self.discarded_weights = False
        self.reloads.append(str(folder))

    # --------------------------------------------------------------------------------- HTTP

    def record(self, what: str) -> None:
        with self._lock:
            self.calls.append(what)
            if self.events is not None:
                self.events.append(f"vllm: {what}")

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"]
        query = scope.get("query_string", b"").decode()
        if path == "/v1/chat/completions":
            deadline = time.monotonic() + self.request_wait_s
            while self.paused:  # accepted and queued, as vLLM does while its scheduler is paused
                if time.monotonic() > deadline:
                    await read_body(receive)
                    message = f"stand-in: a request waited {self.request_wait_s} s for a sleeping engine"
                    await respond_json(send, 503, orjson.dumps({"error": {"message": message}}))
                    return
                await asyncio.sleep(0.02)
            await self._inner(scope, receive, send)
            return
        if path in ("/v1/models", "/health"):
            await self._inner(scope, receive, send)
            return
        self.record(f"{method} {path}" + (f"?{query}" if query else ""))
        if path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
            if self.paused:
                await read_body(receive)
                await respond_json(send, 500, orjson.dumps({"error": {"message": "the engine is asleep"}}))
                return
            await self._inner(scope, receive, send)
            return
        body = await read_body(receive)
        params = parse_qs(query)
        status, answer = 200, {}
        try:
            if path == "/sleep":
                level = int(params.get("level", ["1"])[0])
                await asyncio.to_thread(self._sleep, level)
                answer = {"status": "sleeping", "level": level}
            elif path == "/wake_up":
                tags = params.get("tags") or list(self.TAGS)
                await asyncio.to_thread(self._wake, tags)
                answer = {"status": "sleeping" if self.paused else "awake", "tags": params.get("tags")}
            elif path == "/is_sleeping":
                answer = {"is_sleeping": self.paused}
            elif path == "/collective_rpc":
                rpc = orjson.loads(body)
                if rpc.get("method") != "reload_weights":
                    raise ValueError(f"the stand-in does not run {rpc.get('method')!r}")
                if not self.resident["weights"]:
                    raise RuntimeError("reload_weights into weights that are asleep (not mapped)")
                await asyncio.to_thread(self._reload, Path(rpc["kwargs"]["weights_path"]))
                answer = {"results": [None]}
            elif path == "/reset_prefix_cache":
                self.engine.weights_changed()
                answer = {"success": True}
            else:
                status, answer = 404, {"detail": "Not Found"}
        except (ValueError, RuntimeError) as exc:
            status, answer = 500, {"error": {"message": str(exc)}}
        await respond_json(send, status, orjson.dumps(answer))

    def __enter__(self) -> SleepModeVllm:
        self.engine.start()
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()
        self.engine.close()
