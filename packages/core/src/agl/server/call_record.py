"""One call as the proxy sees it: whether a request can be recorded, what the call's answer told, the record.

`request_problem` runs before anything is forwarded (a request the store could not record is refused, not
answered and then lost), with the parse, on a worker thread for a large body (`parse_chat`; the translated APIs' in agl.server.translated_apis);
a `CallRecord` collects the ids, log-probs, message and status of the answer, JSON body or SSE chunks, checked
first (`answer_problem`, `chunk_problem`: an upstream's answer is not trusted), and becomes the `LLMCall` the
store keeps, with the reason it cannot be trained on, if any.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import unquote

import orjson

from agl.common import attributes as attr
from agl.schema import SAMPLING_REASON_PREFIX, Attribution, LLMCall
from agl.server.request_cost import (
    MAX_REQUEST_STRUCTURES,
    OFF_LOOP_BYTES,
    count_structures,
    heavy_lane,
    structure_problem,
)
from agl.store import new_id

# Sampling parameters that change the distribution a response is drawn from beyond the temperature, with the
# value that leaves it alone. agl trains on softmax(logits / T): a sample drawn from a truncated or penalised
# distribution is not a sample of that policy, so such calls are stored as not trainable (in train rollouts).
NEUTRAL_SAMPLING: dict[str, tuple[Any, ...]] = {
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
        return f"{SAMPLING_REASON_PREFIX}greedily (temperature 0): not a sample of the policy's distribution"
    for key, neutral in NEUTRAL_SAMPLING.items():
        value = body.get(key)
        if value not in neutral:
            return f"{SAMPLING_REASON_PREFIX}with {key}={value!r}: agl trains the temperature-scaled distribution only"
    return None


MALFORMED = "the LLM backend's answer is malformed"


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
        self.served_model_known = False  # the answer named the model that served it
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
        # sampled as the run says, not as the agent asked (UpstreamConfig.own_sampling): its request keeps the ask
        self.sampling_owned = False
        # the agent said `"logprobs": false`: agl still asks the backend (training needs them) and takes them
        # out of the answer the agent gets
        self.strip_logprobs = request_body.get("logprobs") is False
        self.abandoned = False  # the agent hung up before the answer
        self.route = "chat"  # or "responses": the API the agent called (answered through a chat completion)
        self.engine: str | None = None  # the engine's URL, stored where the proxy routes over several
        self.engine_used: Any = None  # the router's Engine this call is counted on (agl.server.engines)
        # whether the agent asked for a stream, where that differs from how the backend was asked (the Responses
        # API streams its events from one chat completion); None: as the backend was asked
        self.client_stream: bool | None = None
        self.heavy = False  # a large request: its record is built off the event loop

    def took_served_model(self, name: Any) -> None:
        """The model the upstream says answered (its answer's `model`): what the call is stored under, beside the
        name the agent asked for. Until the proxy knows the upstream's models, a call goes out under the name the
        agent gave, and only the answer says which model it was."""
        if isinstance(name, str) and name:
            self.model = name
            self.served_model_known = True

    def take_choice(self, body: Any) -> str | None:
        """Read a complete (non-streaming) response; returns what is wrong with it, if anything: then nothing of
        it is taken and the record carries the error (an upstream's malformed answer must neither fail the
        proxy nor become training data)."""
        problem = answer_problem(body)
        if problem is not None:
            self.error = f"{MALFORMED}: {problem}"
            return problem
        choices = body.get("choices") or []
        self.usage = body.get("usage") or {}
        self.prompt_ids = body.get("prompt_token_ids")
        self.took_served_model(body.get("model"))
        if not choices:
            return None
        choice = choices[0]
        self.message = choice.get("message")
        self.finish_reason = choice.get("finish_reason")
        self.response_ids = choice.get("token_ids")
        if self.prompt_ids is None:
            self.prompt_ids = choice.get("prompt_token_ids")
        content = (choice.get("logprobs") or {}).get("content")
        if content is not None:
            self.logprobs = [float(c["logprob"]) for c in content]
        return None

    def take_chunk(self, chunk: Any) -> str | None:
        """Accumulate one streamed chunk; a malformed one is not taken, and the first such is noted as the call's
        error (its bytes went to the agent already: the call can only be kept from training)."""
        problem = chunk_problem(chunk)
        if problem is not None:
            if self.error is None:
                self.error = f"{MALFORMED}: {problem}"
            return problem
        if chunk.get("prompt_token_ids") is not None:
            self.prompt_ids = chunk["prompt_token_ids"]
        if not self.served_model_known:
            self.took_served_model(chunk.get("model"))
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
                    tc.get("index") or 0, {"id": None, "type": "function", "function": {"name": [], "arguments": []}}
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
        return None

    def misaligned(self) -> str | None:
        """Whether the response's ids and log-probs fail to pair one to one (each piece of a stream may agree
        and the whole still not): such a call would train on log-probs of other tokens."""
        if self.response_ids is None or self.logprobs is None or len(self.response_ids) == len(self.logprobs):
            return None
        return f"{MALFORMED}: {len(self.response_ids)} response token ids but {len(self.logprobs)} log-probs"

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
            engine=self.engine,
        )

    def to_call(self, *, stream: bool) -> LLMCall:
        message = self.message
        if stream and (self.content or self.tool_calls):
            message = {"role": "assistant", "content": "".join(self.content) or None}
            if self.tool_calls:
                message["tool_calls"] = [_joined(self.tool_calls[i]) for i in sorted(self.tool_calls)]
        error = self.error or self.misaligned()
        reason = None
        if self.abandoned:
            reason = "abandoned: the agent hung up before the answer"
        elif error is not None:
            reason = "the call failed"
        elif not self.prompt_ids or self.response_ids is None:
            reason = "the backend returned no token ids" if self.asked_token_ids else "token ids were not requested"
        elif int(self.request.get("n") or 1) != 1:
            reason = "n > 1: only the first choice is stored"
        elif self.mode == "train":
            reason = untrainable_sampling({} if self.sampling_owned else self.request, self.temperature)
        usage = self.usage or {
            "prompt_tokens": len(self.prompt_ids or []),
            "completion_tokens": len(self.response_ids or []),
        }
        call = LLMCall(
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
            # a large request came from orjson and passed request_problem: it is JSON already, and validating its
            # million parts again held the interpreter for a second (every other request waited)
            request={} if self.heavy else self.request,
            response_message=message,
            prompt_ids=self.prompt_ids,
            response_ids=self.response_ids,
            logprobs=self.logprobs,
            finish_reason=self.finish_reason,
            stream=stream if self.client_stream is None else self.client_stream,
            status="error" if error else "ok",
            http_status=self.http_status,
            error=error,
            started_at=self.started,
            latency_s=time.perf_counter() - self.t0,
            usage=usage,
            trainable=reason is None,
            not_trainable_reason=reason,
            temperature=self.temperature,
            agent_key=self.agent_key,
            route=self.route,  # type: ignore[arg-type]
            engine=self.engine,
        )
        return call.model_copy(update={"request": self.request}) if self.heavy else call


# Request fields the proxy reads, with the JSON types they must have (and how to say so); anything else goes to
# the backend as it is.
_FIELD_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "model": ((str,), "a string"),
    "stream": ((bool,), "true or false"),
    "n": ((int,), "an integer"),
    "temperature": ((int, float), "a number"),
    "top_p": ((int, float), "a number"),
    "presence_penalty": ((int, float), "a number"),
    "frequency_penalty": ((int, float), "a number"),
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


def unstorable(body: Any) -> str | None:
    """Why the store could not write `body` (nested deeper than orjson writes, 255 levels), found by writing it:
    a walk over a large body in Python held the interpreter for seconds, writing it takes milliseconds."""
    try:
        orjson.dumps(body)
    except orjson.JSONEncodeError as exc:
        return f"request body cannot be stored: {exc} (it nests lists and objects too deep)"
    return None


def depth_problem(body: Any, *, large: bool) -> str | None:
    if large:
        return unstorable(body)
    return f"request body nests lists and objects more than {MAX_JSON_DEPTH} levels deep" if too_deep(body) else None


def request_problem(body: Any, *, large: bool = False, shallow: bool = False) -> str | None:
    """Why a chat request cannot be forwarded and recorded faithfully, or None. Checked before anything is
    sent: a request the store could not record must be refused, not answered and then lost. `large`: a body over
    OFF_LOOP_BYTES, whose depth is checked by writing it (`unstorable`) rather than by a walk in Python; `shallow`:
    one known to open too few objects and lists to nest too deep (`request_cost.count_structures`), not checked."""
    if not isinstance(body, dict):
        return "request body must be a JSON object"
    if not shallow and (deep := depth_problem(body, large=large)) is not None:
        return deep
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
    for key, (low, high) in _RANGES.items():  # OpenAI's ranges: past them a backend divides by or samples nonsense
        value = body.get(key)
        if value is not None and not low <= value <= high:
            return f"'{key}' must be between {low:g} and {high:g}, got {value}"
    return None


_RANGES = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
}


def _ints(value: Any) -> bool:
    return isinstance(value, list) and all(type(v) is int for v in value)  # `type`: a bool is no token id


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _optional(value: Any, types: type | tuple[type, ...]) -> bool:
    return value is None or isinstance(value, types)


def _message_problem(message: Any, where: str, *, streamed: bool) -> str | None:
    """An assistant message (or a stream's delta) the record and the Responses translation can read."""
    if not _optional(message, dict):
        return f"{where} must be an object, got {json_type(message)}"
    if not message:
        return None
    # a delta's pieces of text are joined into the stored message; a whole message may carry content parts
    if not _optional(message.get("content"), str if streamed else (str, list)):
        return f"{where}.content must be a string, got {json_type(message['content'])}"
    if not _optional(message.get("tool_calls"), list):
        return f"{where}.tool_calls must be a list, got {json_type(message['tool_calls'])}"
    for i, call in enumerate(message.get("tool_calls") or []):
        if not isinstance(call, dict):
            return f"{where}.tool_calls[{i}] must be an object, got {json_type(call)}"
        if not _optional(call.get("index"), int) or isinstance(call.get("index"), bool):
            return f"{where}.tool_calls[{i}].index must be an integer, got {json_type(call['index'])}"
        if not _optional(call.get("id"), str):
            return f"{where}.tool_calls[{i}].id must be a string, got {json_type(call['id'])}"
        fn = call.get("function")
        if not _optional(fn, dict):
            return f"{where}.tool_calls[{i}].function must be an object, got {json_type(fn)}"
        for key in ("name", "arguments"):
            if fn and not _optional(fn.get(key), str):
                return f"{where}.tool_calls[{i}].function.{key} must be a string, got {json_type(fn[key])}"
    return None


def choice_problem(choice: Any, where: str, *, message_key: str) -> str | None:
    """What makes one choice (of an answer, or of a streamed chunk) unusable: ids that are not integers,
    log-probs that are not numbers, or as many of the one as of the other when both come."""
    if not isinstance(choice, dict):
        return f"{where} must be an object, got {json_type(choice)}"
    for key in ("token_ids", "prompt_token_ids"):
        if not _optional(choice.get(key), list) or not _ints(choice.get(key) or []):
            return f"{where}.{key} must be a list of integers"
    if not _optional(choice.get("finish_reason"), str):
        return f"{where}.finish_reason must be a string, got {json_type(choice['finish_reason'])}"
    logprobs = choice.get("logprobs")
    if not _optional(logprobs, dict):
        return f"{where}.logprobs must be an object, got {json_type(logprobs)}"
    content = (logprobs or {}).get("content")
    if not _optional(content, list):
        return f"{where}.logprobs.content must be a list, got {json_type(content)}"
    for i, entry in enumerate(content or []):
        if not isinstance(entry, dict) or not _number(entry.get("logprob")):
            return f"{where}.logprobs.content[{i}].logprob must be a number"
    ids = choice.get("token_ids")
    if ids is not None and content is not None and len(ids) != len(content):
        return f"{where} has {len(ids)} token ids but {len(content)} log-probs"
    return _message_problem(choice.get(message_key), f"{where}.{message_key}", streamed=message_key == "delta")


def _body_problem(body: Any, *, what: str) -> str | None:
    if not isinstance(body, dict):
        return f"{what} must be a JSON object, got {json_type(body)}"
    if not _optional(body.get("prompt_token_ids"), list) or not _ints(body.get("prompt_token_ids") or []):
        return "prompt_token_ids must be a list of integers"
    usage = body.get("usage")
    if not _optional(usage, dict):
        return f"usage must be an object, got {json_type(usage)}"
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        if usage and not (_optional(usage.get(key), int) and not isinstance(usage.get(key), bool)):
            return f"usage.{key} must be an integer, got {json_type(usage[key])}"
    return None


def answer_problem(body: Any) -> str | None:
    """What makes a complete (non-streamed) chat completion unusable, or None."""
    return _choices_problem(body, what="the answer", where="", key="message", required=True)


def chunk_problem(chunk: Any) -> str | None:
    """What makes one streamed chunk unusable, or None (a chunk without choices, as the usage chunk, is fine)."""
    return _choices_problem(chunk, what="a streamed chunk", where="a streamed chunk's ", key="delta", required=False)


def _choices_problem(body: Any, *, what: str, where: str, key: str, required: bool) -> str | None:
    problem = _body_problem(body, what=what)
    if problem is not None:
        return problem
    choices = body.get("choices")
    if not (isinstance(choices, list) if required else _optional(choices, list)):
        return f"{where}choices must be a list of objects, got {json_type(choices)}"
    for i, choice in enumerate(choices or []):
        problem = choice_problem(choice, f"{where}choices[{i}]", message_key=key)
        if problem is not None:
            return problem
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


T = TypeVar("T")


async def off_loop_if_large(parse: Callable[[bytes], T], raw: bytes) -> T:
    """`parse(raw)`, on a worker thread when `raw` is large enough to stall the event loop (OFF_LOOP_BYTES)."""
    if len(raw) > OFF_LOOP_BYTES:
        return await heavy_lane(parse, raw)
    return parse(raw)


def parse_chat(raw: bytes, max_structures: int = MAX_REQUEST_STRUCTURES) -> dict[str, Any] | str:
    """A chat-completions request body, parsed and checked: the body, or why it is refused (a 400)."""
    large = len(raw) > OFF_LOOP_BYTES
    opened = count_structures(raw) if large else None
    if (dense := structure_problem(raw, max_structures, opened=opened)) is not None:
        return dense
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return f"request body is not valid JSON: {exc}"
    # a large body's depth is found by writing it, which held the interpreter lock ~17 ms per 30 MB: not done for
    # one that opens too few objects and lists to nest too deep
    shallow = opened is not None and opened <= MAX_JSON_DEPTH
    problem = request_problem(body, large=large, shallow=shallow)
    return problem if problem is not None else body


def json_or_none(content: bytes) -> Any:
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        return None


def without_logprobs(body: dict[str, Any]) -> dict[str, Any]:
    """The answer as an agent that asked for no log-probs would get it (the backend was asked for them)."""
    for choice in body.get("choices") or []:
        if isinstance(choice, dict) and "logprobs" in choice:
            choice["logprobs"] = None
    return body


def event_without_logprobs(event: bytes) -> bytes:
    lines = []
    for line in event.split(b"\n"):
        if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
            try:
                chunk = orjson.loads(line[5:].strip())
            except orjson.JSONDecodeError:
                chunk = None
            if isinstance(chunk, dict):
                line = b"data: " + orjson.dumps(without_logprobs(chunk))
        lines.append(line)
    return b"\n".join(lines)
