"""An OpenAI-compatible HTTP front for the embedded engine, answering as vLLM does when asked for token ids.

`agl serve --upstream http://127.0.0.1:<port>/v1` forwards agents' calls here. Each answer carries
`prompt_token_ids` (the ids of the prompt the engine built, see `chat_format`) and `choices[0].token_ids` when
the request has `return_token_ids`, and per-token log-probs when it has `logprobs`. Streams send the tokens as
they are generated, except when tools or stop strings are in play: then the answer is parsed (or cut) first and
sent in one go, so a stream never shows a tool call as text or the start of a stop string.

Calls of evaluation rollouts (agl's proxy says so in `x-agl-rollout-mode: eval`) are all decoded at one
`eval_temperature` (0, greedy, unless the trainer says otherwise), whatever the agent asked for.
The requested model name picks a LoRA adapter when one of that name is loaded, `base` the model with adapters
off; any other name is served by the engine's current policy. A prompt longer than the model's context is
refused with 400, as vLLM does. New adapter weights are loaded while serving with `POST /v1/load_lora_adapter`
`{"lora_name": ..., "lora_path": ...}` and dropped with `POST /v1/unload_lora_adapter` (vLLM's routes).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from agl.common.asgi import ThreadedServer
from agl.protocol import HEADER_ROLLOUT_MODE, error_bytes
from agl_trainer.chat_format import parse_answer, render_prompt
from agl_trainer.engines.embedded import BASE_MODEL, Engine, GenerationRequest, GenerationResult
from agl_trainer.engines.lora_weights import AdapterError, load_adapter, loaded_adapters, unload_adapter

DEFAULT_MAX_TOKENS = 512
MODE_HEADER = HEADER_ROLLOUT_MODE  # set by agl's proxy: "train" or "eval"


class BadRequest(ValueError):
    pass


def _error(status: int, message: str, type_: str = "invalid_request_error") -> Response:
    return Response(error_bytes(message, type_), status_code=status, media_type="application/json")


class ChatService:
    def __init__(
        self,
        engine: Engine,
        served_model: str = "agl-policy",
        default_temperature: float = 1.0,
        eval_temperature: float = 0.0,
    ) -> None:
        self.engine = engine
        self.served_model = served_model
        self.default_temperature = default_temperature  # for requests that set none (training rollouts)
        self.eval_temperature = eval_temperature  # for every call of an evaluation rollout

    # ----------------------------------------------------------------------------------- parsing

    def _request(self, body: Any) -> tuple[GenerationRequest, dict[str, Any]]:
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
            raise BadRequest("request body must be a JSON object with a non-empty 'messages' list")
        if int(body.get("n") or 1) != 1:
            raise BadRequest("n > 1 is not supported by the embedded engine: send n requests")
        tools = body.get("tools") or None
        if tools is not None and not isinstance(tools, list):
            raise BadRequest("'tools' must be a list")
        try:
            prompt = render_prompt(self.engine.tokenizer, body["messages"], tools)
        except Exception as exc:
            raise BadRequest(f"cannot render the messages with the model's chat template: {exc}") from exc
        prompt_ids = list(self.engine.tokenizer(prompt, add_special_tokens=False).input_ids)
        if len(prompt_ids) >= self.engine.max_context:
            raise BadRequest(
                f"This model's maximum context length is {self.engine.max_context} tokens. However, your messages"
                f" resulted in {len(prompt_ids)} tokens."
            )
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else list(stop)
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or DEFAULT_MAX_TOKENS
        temperature = body.get("temperature")
        top_p = body.get("top_p")
        model = str(body.get("model") or self.served_model)
        request = GenerationRequest(
            prompt_ids=prompt_ids,
            max_tokens=int(max_tokens),
            temperature=self.default_temperature if temperature is None else float(temperature),
            top_p=1.0 if top_p is None else float(top_p),
            stop=stop,
            seed=body.get("seed"),
            adapter=model if model in self.adapters() or model == BASE_MODEL else None,
        )
        return request, {
            "tools": tools,
            "model": model,
            "want_ids": bool(body.get("return_token_ids")),
            "want_logprobs": bool(body.get("logprobs")),
            "stream": bool(body.get("stream")),
            "include_usage": bool((body.get("stream_options") or {}).get("include_usage")),
        }

    def adapters(self) -> set[str]:
        return loaded_adapters(self.engine.model)

    async def load_lora(self, request: Request) -> Response:
        try:
            body = orjson.loads(await request.body())
            if not isinstance(body, dict) or not body.get("lora_name") or not body.get("lora_path"):
                raise AdapterError("body must be a JSON object with 'lora_name' and 'lora_path'")
            name, path = str(body["lora_name"]), str(body["lora_path"])
            replaced = await asyncio.to_thread(load_adapter, self.engine, name, path)
        except (AdapterError, orjson.JSONDecodeError) as exc:
            return _error(400, str(exc))
        verb = "replaced" if replaced else "loaded"
        return Response(f"adapter {name!r} {verb} from {path}", media_type="text/plain")

    async def unload_lora(self, request: Request) -> Response:
        try:
            body = orjson.loads(await request.body())
            if not isinstance(body, dict) or not body.get("lora_name"):
                raise AdapterError("body must be a JSON object with 'lora_name'")
            await asyncio.to_thread(unload_adapter, self.engine, str(body["lora_name"]))
        except (AdapterError, orjson.JSONDecodeError) as exc:
            return _error(400, str(exc))
        return Response(f"adapter {body['lora_name']!r} unloaded", media_type="text/plain")

    def _logprob_entries(self, ids: list[int], logprobs: list[float]) -> list[dict[str, Any]]:
        tokens = self.engine.tokenizer.convert_ids_to_tokens(ids)
        return [
            {"token": t, "logprob": lp, "bytes": None, "top_logprobs": []}
            for t, lp in zip(tokens, logprobs, strict=True)
        ]

    def _answer(self, result: GenerationResult, opts: dict[str, Any]) -> tuple[dict[str, Any], str]:
        parsed = parse_answer(result.text, opts["tools"])
        finish = "tool_calls" if parsed.tool_calls else result.finish_reason
        return parsed.message(), finish

    def _usage(self, result: GenerationResult) -> dict[str, int]:
        return {
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": len(result.token_ids),
            "total_tokens": result.prompt_tokens + len(result.token_ids),
        }

    # ---------------------------------------------------------------------------------- handlers

    async def chat(self, request: Request) -> Response:
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            return _error(400, f"request body is not valid JSON: {exc}")
        try:
            gen, opts = self._request(body)
        except BadRequest as exc:
            return _error(400, str(exc))
        if request.headers.get(MODE_HEADER) == "eval":
            gen.temperature = self.eval_temperature  # every evaluation is decoded the same way
        if opts["stream"]:
            return StreamingResponse(self._stream(gen, opts), media_type="text/event-stream")
        try:
            result = await asyncio.wrap_future(self.engine.submit(gen))
        except ValueError as exc:
            return _error(400, str(exc))
        message, finish = self._answer(result, opts)
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        if opts["want_logprobs"]:
            choice["logprobs"] = {"content": self._logprob_entries(result.token_ids, result.logprobs)}
        out: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": opts["model"],
            "choices": [choice],
            "usage": self._usage(result),
        }
        if opts["want_ids"]:
            choice["token_ids"] = result.token_ids
            out["prompt_token_ids"] = gen.prompt_ids
        return Response(orjson.dumps(out), media_type="application/json")

    async def _stream(self, gen: GenerationRequest, opts: dict[str, Any]) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        live = not opts["tools"] and not gen.stop
        tokens: asyncio.Queue[tuple[int, float]] = asyncio.Queue()
        if live:

            def on_token(token: int, logprob: float) -> None:
                loop.call_soon_threadsafe(tokens.put_nowait, (token, logprob))

            gen.on_token = on_token
        base = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": opts["model"],
        }

        def event(
            delta: dict[str, Any], ids: list[int], lps: list[float], finish: str | None = None, **extra: Any
        ) -> bytes:
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
            if opts["want_logprobs"] and ids:
                choice["logprobs"] = {"content": self._logprob_entries(ids, lps)}
            if opts["want_ids"]:
                choice["token_ids"] = ids
            return b"data: " + orjson.dumps({**base, "choices": [choice], **extra}) + b"\n\n"

        first: dict[str, Any] = {"prompt_token_ids": gen.prompt_ids} if opts["want_ids"] else {}
        yield event({"role": "assistant", "content": ""}, [], [], **first)
        try:
            future = self.engine.submit(gen)
        except ValueError as exc:
            yield b"data: " + error_bytes(str(exc), "invalid_request_error") + b"\n\n"
            return
        seen: list[int] = []  # every token reported so far
        flushed = 0  # how many of them went out in a chunk
        sent_text = ""
        lps: list[float] = []
        if live:
            decoder = self.engine.tokenizer
            while not (future.done() and tokens.empty()):
                try:
                    token, lp = await asyncio.wait_for(tokens.get(), timeout=0.05)
                except TimeoutError:
                    continue
                seen.append(token)
                lps.append(lp)
                text = decoder.decode(seen, skip_special_tokens=True)
                if text.endswith("\ufffd"):  # half of a multi-byte character: wait for the rest
                    continue
                piece, sent_text = text[len(sent_text) :], text
                yield event({"content": piece}, seen[flushed:], lps[flushed:])
                flushed = len(seen)
        result = await asyncio.wrap_future(future)
        message, finish = self._answer(result, opts)
        if live:
            rest = result.text[len(sent_text) :]
            yield event(
                {"content": rest} if rest else {}, result.token_ids[flushed:], result.logprobs[flushed:], finish
            )
        else:
            if message.get("tool_calls"):
                delta: dict[str, Any] = {"tool_calls": [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]}
                if message.get("content"):
                    delta["content"] = message["content"]
            else:
                delta = {"content": message.get("content") or ""}
            yield event(delta, result.token_ids, result.logprobs)
            yield event({}, [], [], finish)
        if opts["include_usage"]:
            yield b"data: " + orjson.dumps({**base, "choices": [], "usage": self._usage(result)}) + b"\n\n"
        yield b"data: [DONE]\n\n"

    async def models(self, request: Request) -> Response:
        names = [self.served_model, *sorted(self.adapters()), *([BASE_MODEL] if self.adapters() else [])]
        data = [{"id": n, "object": "model", "created": 0, "owned_by": "agl"} for n in dict.fromkeys(names)]
        return Response(orjson.dumps({"object": "list", "data": data}), media_type="application/json")

    async def health(self, request: Request) -> Response:
        return Response(
            orjson.dumps(
                {"ok": True, "batches": self.engine.batches, "generated_tokens": self.engine.generated_tokens}
            ),
            media_type="application/json",
        )


def create_app(
    engine: Engine, served_model: str = "agl-policy", default_temperature: float = 1.0, eval_temperature: float = 0.0
) -> Starlette:
    service = ChatService(engine, served_model, default_temperature, eval_temperature)
    return Starlette(
        routes=[
            Route("/v1/chat/completions", service.chat, methods=["POST"]),
            Route("/v1/models", service.models, methods=["GET"]),
            Route("/v1/load_lora_adapter", service.load_lora, methods=["POST"]),
            Route("/v1/unload_lora_adapter", service.unload_lora, methods=["POST"]),
            Route("/health", service.health, methods=["GET"]),
        ]
    )


class EngineServer(ThreadedServer):
    """The engine's HTTP front served from a background thread of this process (the trainer's setup: the model
    that generates is the one being trained, so nothing is copied between them); `url` ends in `/v1`."""

    def __init__(
        self,
        engine: Engine,
        *,
        served_model: str = "agl-policy",
        host: str = "127.0.0.1",
        port: int = 0,
        default_temperature: float = 1.0,
        eval_temperature: float = 0.0,
    ) -> None:
        app = create_app(engine, served_model, default_temperature, eval_temperature)
        super().__init__(app, host=host, port=port, lifespan="off", name="agl-engine-http")
        self.url += "/v1"
