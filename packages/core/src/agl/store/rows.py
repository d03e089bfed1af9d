"""Rows ↔ records: the values a model is written as, and the model a row is read back as.

Rows are read back with trusted constructors, not validated again: every row was validated when it was
written (by the API's models, then by the store's own), and validating again, or going through
`model_construct`, cost more than reading the row. A row maps onto its model by position: it is selected with
the column names of `agl.store.schema`, which follow the model's field order.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel

from agl.schema import (
    Attempt,
    AttemptStatus,
    Attribution,
    LLMCall,
    ModelVersion,
    Reward,
    RewardIn,
    RewardSource,
    Rollout,
    RolloutStatus,
    Span,
    SpanIn,
    SpanStatus,
    Task,
)
from agl.store.codec import TokenIds, decode_floats, dumps, encode_floats, encode_ids, loads
from agl.store.prompt_bases import PromptBases
from agl.store.schema import (
    ATTEMPT_COLUMNS,
    LLM_CALL_COLUMNS,
    MODEL_VERSION_COLUMNS,
    REWARD_COLUMNS,
    ROLLOUT_COLUMNS,
    SPAN_COLUMNS,
    TASK_COLUMNS,
)

M = TypeVar("M", bound=BaseModel)
Row = Sequence[Any]

_set = object.__setattr__


_ALL_FIELDS: dict[type[BaseModel], set[str]] = {}


def trusted(cls: type[M], values: dict[str, Any]) -> M:
    """`cls` holding `values` (every field, in field order), unchecked: what `model_construct` makes of a complete
    set of fields, without its per-field loop (for models with no private attributes or post-init hook).

    Every record of a class shares one set of its set fields, all of them: a set per record was a third of the
    objects a training read left to the cycle collector. Sharing is safe because pydantic only ever adds a field's
    name to it (on assignment), and every name is in it already; copies get a set of their own."""
    model = cls.__new__(cls)
    fields = _ALL_FIELDS.get(cls)
    if fields is None:
        fields = _ALL_FIELDS[cls] = set(cls.model_fields)
    _set(model, "__dict__", values)
    _set(model, "__pydantic_fields_set__", fields)
    _set(model, "__pydantic_extra__", None)
    _set(model, "__pydantic_private__", None)
    return model


# value → member; a dict lookup costs a fraction of calling the enum
_ROLLOUT_STATUS = {m.value: m for m in RolloutStatus}
_ATTEMPT_STATUS = {m.value: m for m in AttemptStatus}
ATTRIBUTIONS = {m.value: m for m in Attribution}
REWARD_SOURCES = {m.value: m for m in RewardSource}
_SPAN_STATUS = {m.value: m for m in SpanStatus}
_BASE_SEQ = len(LLM_CALL_COLUMNS)  # where a call row's PROMPT_BASE_COLUMNS begin

# ------------------------------------------------------------------------------------ row → model


def task(row: Row) -> Task:
    d = dict(zip(TASK_COLUMNS, row, strict=True))
    d["input"] = loads(d["input"])
    d["metadata"] = loads(d["metadata"])
    return trusted(Task, d)


def rollout(row: Row) -> Rollout:
    d = dict(zip(ROLLOUT_COLUMNS, row, strict=True))
    d["status"] = _ROLLOUT_STATUS[d["status"]]
    d["metadata"] = loads(d["metadata"])
    return trusted(Rollout, d)


def attempt(row: Row) -> Attempt:
    d = dict(zip(ATTEMPT_COLUMNS, row, strict=True))
    d["status"] = _ATTEMPT_STATUS[d["status"]]
    return trusted(Attempt, d)


def span(row: Row) -> Span:
    d = dict(zip(SPAN_COLUMNS, row, strict=True))
    d["attributes"] = loads(d["attributes"])
    d["status"] = _SPAN_STATUS[d["status"]]
    d["events"] = loads(d["events"])
    return trusted(Span, d)


def reward(row: Row) -> Reward:
    d = dict(zip(REWARD_COLUMNS, row, strict=True))
    d["source"] = REWARD_SOURCES[d["source"]]
    d["metadata"] = loads(d["metadata"])
    return trusted(Reward, d)


def model_version(row: Row) -> ModelVersion:
    d = dict(zip(MODEL_VERSION_COLUMNS, row, strict=True))
    d["agent_models"] = loads(d["agent_models"]) if d["agent_models"] else {}  # NULL in rows older than schema 2
    d["metadata"] = loads(d["metadata"])
    return trusted(ModelVersion, d)


def llm_call_reader() -> Callable[[Row], LLMCall]:
    """A reader of LLM call rows (LLM_CALL_COLUMNS, then PROMPT_BASE_COLUMNS), read in (attempt, seq) order: it
    rebuilds prompts stored against an earlier call's (`PromptBases`), and a prompt shares the ints of the
    previous call's prompt and response when it extends them (`TokenIds`)."""
    ids = TokenIds()
    bases = PromptBases()

    def read(row: Row) -> LLMCall:
        d = dict(zip(LLM_CALL_COLUMNS, row[:_BASE_SEQ], strict=True))
        prompt = bases.whole(d["attempt_id"], d["seq"], d["prompt_ids"], d["response_ids"], *row[_BASE_SEQ:])
        d["attribution"] = ATTRIBUTIONS[d["attribution"]]
        d["request"] = loads(d["request"])
        d["response_message"] = loads(d["response_message"])
        d["prompt_ids"], d["response_ids"] = ids.decode(prompt, d["response_ids"])
        d["logprobs"] = decode_floats(d["logprobs"])
        d["stream"] = bool(d["stream"])
        d["usage"] = loads(d["usage"])
        d["trainable"] = bool(d["trainable"])
        return trusted(LLMCall, d)

    return read


# ------------------------------------------------------------------------------------ model → row


def llm_call_values(call: LLMCall) -> tuple[Any, ...]:
    """The row of a call, in LLM_CALL_COLUMNS order, its prompt whole (the writer may store it against an
    earlier call's: agl.store.prompt_bases)."""
    return (
        call.id,
        call.rollout_id,
        call.attempt_id,
        call.seq,
        call.agent_name,
        call.attribution.value,
        call.trace_id,
        call.parent_span_id,
        call.model_requested,
        call.model,
        call.model_version,
        dumps(call.request),
        dumps(call.response_message) if call.response_message is not None else None,
        encode_ids(call.prompt_ids),
        encode_ids(call.response_ids),
        encode_floats(call.logprobs),
        call.finish_reason,
        int(call.stream),
        call.status,
        call.http_status,
        call.error,
        call.started_at,
        call.latency_s,
        dumps(call.usage),
        int(call.trainable),
        call.not_trainable_reason,
        call.temperature,
        call.agent_key,
        call.route,
        call.engine,
    )


def span_values(s: SpanIn) -> tuple[Any, ...]:
    """The row of a span, in SPAN_COLUMNS order."""
    return (
        s.trace_id,
        s.span_id,
        s.parent_id,
        s.name,
        s.kind,
        s.start_time,
        s.end_time,
        dumps(s.attributes),
        s.status.value,
        s.status_message,
        dumps(s.events),
        s.rollout_id,
        s.attempt_id,
        s.agent_name,
        s.source,
    )


def reward_values(r: RewardIn) -> tuple[Any, ...]:
    """The row of a reward, in REWARD_COLUMNS order less `id` (the table numbers rewards)."""
    return (
        r.rollout_id,
        r.attempt_id,
        r.value,
        r.name,
        r.source.value,
        r.after_llm_seq,
        r.span_id,
        r.agent_name,
        r.timestamp if r.timestamp is not None else time.time(),
        dumps(r.metadata),
        r.uid,
    )
