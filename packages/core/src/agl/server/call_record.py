"""One call as the proxy sees it: whether a request can be recorded, what the call's answer told, the record.

`request_problem` runs before anything is forwarded (a request the store could not record is refused, not
answered and then lost); a `CallRecord` collects the ids, log-probs, message and status of the answer, JSON body
or SSE chunks, and becomes the `LLMCall` the store keeps, with the reason it cannot be trained on, if any.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import unquote

from agl.common import attributes as attr
from agl.schema import Attribution, LLMCall
from agl.store import new_id

# Sampling parameters that change the distribution a response is drawn from beyond the temperature, with the
# value that leaves it alone. agl trains on softmax(logits / T): a sample drawn from a truncated or penalised
# distribution is not a sample of that policy, so such calls are stored as not trainable (in train rollouts).
_NEUTRAL_SAMPLING: dict[str, tuple[Any, ...]] = {
    "top_p": (None, 1, 1.0),
    "top_k": (None, 0, -1),
    "min_p": (None, 0, 0.0),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "logit_bias": (None, {}),
}


def untrainable_sampling(body: dict[str, Any], temperature: float | None) -> str | None:
    """Why a response sampled with these parameters is not a sample of the policy agl trains, or None."""
    if temperature is not None and temperature <= 0:
        return "sampled greedily (temperature 0): not a sample of the policy's distribution"
    for key, neutral in _NEUTRAL_SAMPLING.items():
        value = body.get(key)
        if value not in neutral:
            return f"sampled with {key}={value!r}: agl trains the temperature-scaled distribution only"
    return None


class CallRecord:
    """What the proxy learns about one call while it runs; becomes an `LLMCall`."""

    def __init__(self, request_body: dict[str, Any], rollout_id: str, attempt_id: str, seq: int, headers: Any) -> None:
        self.started = time.time()
        self.t0 = time.perf_counter()
        self.request = request_body
        self.rollout_id = rollout_id
        self.attempt_id = attempt_id
        self.seq = seq
        agent = headers.get(attr.HEADER_AGENT)
        self.agent: str | None = unquote(agent) if agent else None  # percent-encoded UTF-8 (see http_inject)
        key = headers.get(attr.HEADER_AGENT_KEY) if agent else None
        self.agent_key: str | None = unquote(key) if key else None
        self.hooked = agent is not None or headers.get(attr.HEADER_HOOK) is not None
        self.parent_span: str | None = headers.get(attr.HEADER_PARENT_SPAN) or None
        self.trace_id: str | None = None
        traceparent = headers.get(attr.HEADER_TRACEPARENT)
        if traceparent:
            parts = traceparent.split("-")
            if len(parts) == 4 and len(parts[1]) == 32:
                self.trace_id = parts[1]
        self.model: str | None = None
        self.model_version: int | None = None
        self.prompt_ids: list[int] | None = None
        self.response_ids: list[int] | None = None
        self.logprobs: list[float] | None = None
        self.content: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.message: dict[str, Any] | None = None
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] = {}
        self.http_status = 200
        self.error: str | None = None
        self.asked_token_ids = False
        self.mode = "train"
        self.temperature: float | None = None  # the temperature the backend was asked to sample with
        # the agent said `"logprobs": false`: agl still asks the backend (training needs them) and takes them
        # out of the answer the agent gets
        self.strip_logprobs = request_body.get("logprobs") is False
        self.abandoned = False  # the agent hung up before the answer
        self.route = "chat"  # or "responses": the API the agent called (answered through a chat completion)
        # whether the agent asked for a stream, where that differs from how the backend was asked (the Responses
        # API streams its events from one chat completion); None: as the backend was asked
        self.client_stream: bool | None = None

    def take_choice(self, body: dict[str, Any]) -> None:
        """Read a complete (non-streaming) response."""
        choices = body.get("choices") or []
        self.usage = body.get("usage") or {}
        self.prompt_ids = body.get("prompt_token_ids")
        if not choices:
            return
        choice = choices[0]
        self.message = choice.get("message")
        self.finish_reason = choice.get("finish_reason")
        self.response_ids = choice.get("token_ids")
        if self.prompt_ids is None:
            self.prompt_ids = choice.get("prompt_token_ids")
        content = (choice.get("logprobs") or {}).get("content")
        if content is not None:
            self.logprobs = [float(c["logprob"]) for c in content]

    def take_chunk(self, chunk: dict[str, Any]) -> None:
        """Accumulate one streamed chunk."""
        if chunk.get("prompt_token_ids") is not None:
            self.prompt_ids = chunk["prompt_token_ids"]
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            if choice.get("prompt_token_ids") is not None and self.prompt_ids is None:
                self.prompt_ids = choice["prompt_token_ids"]
            # appended in place: a long answer is thousands of chunks, and rebuilding the lists (or strings) at
            # every chunk made one stream quadratic in its length, on the event loop every other call shares
            ids = choice.get("token_ids")
            if ids is not None:
                if self.response_ids is None:
                    self.response_ids = []
                self.response_ids.extend(ids)
            content = (choice.get("logprobs") or {}).get("content")
            if content:
                if self.logprobs is None:
                    self.logprobs = []
                self.logprobs.extend(float(c["logprob"]) for c in content)
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.content.append(delta["content"])
            for tc in delta.get("tool_calls") or []:
                slot = self.tool_calls.setdefault(
                    tc.get("index", 0), {"id": None, "type": "function", "function": {"name": [], "arguments": []}}
                )
                if tc.get("id"):
                    slot["id"] = tc["id"]
                fn = tc.get("function") or {}
                if fn.get("name"):
                    slot["function"]["name"].append(fn["name"])
                if fn.get("arguments"):
                    slot["function"]["arguments"].append(fn["arguments"])
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def fallback_call(self, *, stream: bool, why: str) -> LLMCall:
        """A minimal record of a call whose full record could not be built: stored, flagged, never lost."""
        return LLMCall(
            id=new_id("llm"),
            rollout_id=self.rollout_id,
            attempt_id=self.attempt_id,
            seq=self.seq,
            agent_name=self.agent,
            agent_key=self.agent_key,
            attribution=Attribution.scope if self.agent else Attribution.unattributed,
            trace_id=self.trace_id,
            parent_span_id=self.parent_span,
            model_requested=None,
            model=None,
            model_version=self.model_version,
            request={"unrecorded": why},
            response_message=None,
            prompt_ids=None,
            response_ids=None,
            logprobs=None,
            finish_reason=self.finish_reason,
            stream=stream if self.client_stream is None else self.client_stream,
            status="error",
            http_status=self.http_status,
            error=f"the call could not be recorded: {why}",
            started_at=self.started,
            latency_s=time.perf_counter() - self.t0,
            usage={},
            trainable=False,
            not_trainable_reason=f"the call could not be recorded: {why}",
            temperature=self.temperature,
            route=self.route,  # type: ignore[arg-type]
        )

    def to_call(self, *, stream: bool) -> LLMCall:
        message = self.message
        if stream and (self.content or self.tool_calls):
            message = {"role": "assistant", "content": "".join(self.content) or None}
            if self.tool_calls:
                message["tool_calls"] = [_joined(self.tool_calls[i]) for i in sorted(self.tool_calls)]
        reason = None
        if self.abandoned:
            reason = "abandoned: the agent hung up before the answer"
        elif self.error is not None:
            reason = "the call failed"
        elif not self.prompt_ids or self.response_ids is None:
            reason = "the backend returned no token ids" if self.asked_token_ids else "token ids were not requested"
        elif int(self.request.get("n") or 1) != 1:
            reason = "n > 1: only the first choice is stored"
        elif self.mode == "train":
            reason = untrainable_sampling(self.request, self.temperature)
        usage = self.usage or {
            "prompt_tokens": len(self.prompt_ids or []),
            "completion_tokens": len(self.response_ids or []),
        }
        return LLMCall(
            id=new_id("llm"),
            rollout_id=self.rollout_id,
            attempt_id=self.attempt_id,
            seq=self.seq,
            agent_name=self.agent,
            attribution=(
                Attribution.scope if self.agent else (Attribution.unattributed if self.hooked else Attribution.unhooked)
            ),
            trace_id=self.trace_id,
            parent_span_id=self.parent_span,
            model_requested=self.request.get("model"),
            model=self.model,
            model_version=self.model_version,
            request=self.request,
            response_message=message,
            prompt_ids=self.prompt_ids,
            response_ids=self.response_ids,
            logprobs=self.logprobs,
            finish_reason=self.finish_reason,
            stream=stream if self.client_stream is None else self.client_stream,
            status="error" if self.error else "ok",
            http_status=self.http_status,
            error=self.error,
            started_at=self.started,
            latency_s=time.perf_counter() - self.t0,
            usage=usage,
            trainable=reason is None,
            not_trainable_reason=reason,
            temperature=self.temperature,
            agent_key=self.agent_key,
            route=self.route,  # type: ignore[arg-type]
        )


# Request fields the proxy reads, with the JSON types they must have (and how to say so); anything else goes to
# the backend as it is.
_FIELD_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "model": ((str,), "a string"),
    "stream": ((bool,), "true or false"),
    "n": ((int,), "an integer"),
    "temperature": ((int, float), "a number"),
    "top_p": ((int, float), "a number"),
    "max_tokens": ((int,), "an integer"),
    "max_completion_tokens": ((int,), "an integer"),
    "logprobs": ((bool,), "true or false"),
    "tools": ((list,), "a list"),
}


# JSON nesting a request may have: orjson writes at most 255 levels, so a request nested deeper could be answered
# and then not stored; nothing a model is sent needs more than a few
MAX_JSON_DEPTH = 64


def too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether `value` nests lists and objects more than `limit` levels deep (walked without recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def request_problem(body: Any) -> str | None:
    """Why a chat request cannot be forwarded and recorded faithfully, or None. Checked before anything is
    sent: a request the store could not record must be refused, not answered and then lost."""
    if not isinstance(body, dict):
        return "request body must be a JSON object"
    if too_deep(body):
        return f"request body nests lists and objects more than {MAX_JSON_DEPTH} levels deep"
    messages = body.get("messages")
    if not isinstance(messages, list):
        return "request body must be a JSON object with a 'messages' list"
    if not all(isinstance(m, dict) for m in messages):
        return "every entry of 'messages' must be an object"
    for key, (types, expected) in _FIELD_TYPES.items():
        value = body.get(key)
        if value is None:
            continue
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            return f"'{key}' must be {expected}, got {json_type(value)}"
    n = body.get("n")
    if n is not None and not 1 <= n <= 128:
        return f"'n' must be between 1 and 128, got {n}"
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if value is not None and not 1 <= value <= 2**31:
            return f"'{key}' must be a positive integer below 2**31, got {value}"
    return None


def json_type(value: Any) -> str:
    names = {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _joined(slot: dict[str, Any]) -> dict[str, Any]:
    """A streamed tool call as one message part: its name and arguments, received in pieces, joined."""
    fn = slot["function"]
    return {**slot, "function": {"name": "".join(fn["name"]), "arguments": "".join(fn["arguments"])}}
