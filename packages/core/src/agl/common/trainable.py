"""What training reads of a rollout: its final attempt, with token ids kept packed.

`RolloutDetail` is everything stored about a rollout, as pydantic models with token ids as lists of Python ints:
right for `agl show` and the API, and the slowest possible input for training. Making an int object for every
token id (and touching each one's reference count whenever a list is copied) was most of the time of reading a
step's calls back. `TrainableRollout` holds only what transitions, credit assignment and AIR rules use — the
rollout, its task, and the spans, LLM calls and rewards of its final attempt — and keeps token ids and
log-probs as packed `array`s from the store's BLOBs to the trainer's tensors.

It reads like a `RolloutDetail` (the same attribute names, `TrainableCall` like `LLMCall`), so AIR rules and
`agl.learn.transitions` take either (`RolloutView`, `CallView`). Over HTTP it travels in binary or as JSON
(agl.common.trainable_wire).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, Self

import orjson
from pydantic import JsonValue

from agl.schema import Attribution, Reward, Rollout, Span, Task


class CallView(Protocol):
    """An LLM call as training and AIR rules read it: an `LLMCall` or a `TrainableCall`."""

    @property
    def id(self) -> str: ...
    @property
    def rollout_id(self) -> str: ...
    @property
    def attempt_id(self) -> str: ...
    @property
    def seq(self) -> int: ...
    @property
    def agent_name(self) -> str | None: ...
    @property
    def agent_key(self) -> str | None: ...
    @property
    def attribution(self) -> Attribution: ...
    @property
    def status(self) -> str: ...
    @property
    def trainable(self) -> bool: ...
    @property
    def not_trainable_reason(self) -> str | None: ...
    @property
    def model_version(self) -> int | None: ...
    @property
    def temperature(self) -> float | None: ...
    @property
    def started_at(self) -> float: ...
    @property
    def latency_s(self) -> float: ...
    @property
    def prompt_ids(self) -> Sequence[int] | None: ...
    @property
    def response_ids(self) -> Sequence[int] | None: ...
    @property
    def logprobs(self) -> Sequence[float] | None: ...
    @property
    def response_message(self) -> dict[str, JsonValue] | None: ...


class RolloutView(Protocol):
    """A rollout as training and AIR rules read it: a `RolloutDetail` or a `TrainableRollout`. Only the final
    attempt's calls, spans and rewards count for training (a `RolloutDetail` also holds earlier attempts')."""

    @property
    def rollout(self) -> Rollout: ...
    @property
    def task(self) -> Task: ...
    @property
    def spans(self) -> Sequence[Span]: ...
    @property
    def llm_calls(self) -> Sequence[CallView]: ...
    @property
    def rewards(self) -> Sequence[Reward]: ...

    def with_rewards(self, rewards: list[Reward]) -> Self: ...


_NOT_READ: Any = object()  # response_message not decoded yet


@dataclass(slots=True, eq=False)
class TrainableCall:
    """An LLM call as training reads it (the fields of `LLMCall` that transitions and AIR rules use). Token ids
    are int32 arrays and log-probs float64 arrays; the answer message is decoded from its JSON on first use."""

    id: str
    rollout_id: str
    attempt_id: str
    seq: int
    agent_name: str | None
    agent_key: str | None
    attribution: Attribution
    status: str
    trainable: bool
    not_trainable_reason: str | None
    model_version: int | None
    temperature: float | None
    started_at: float
    latency_s: float
    prompt_ids: array[int] | None
    response_ids: array[int] | None
    logprobs: array[float] | None
    response_json: str | None  # the answer message as stored (JSON text)
    _message: Any = field(default=_NOT_READ, repr=False)

    @property
    def response_message(self) -> dict[str, JsonValue] | None:
        if self._message is _NOT_READ:
            self._message = None if self.response_json is None else orjson.loads(self.response_json)
        return self._message  # type: ignore[no-any-return]


@dataclass(slots=True, eq=False)
class TrainableRollout:
    """A rollout with the spans, LLM calls (in `seq` order) and rewards of its final attempt."""

    rollout: Rollout
    task: Task
    spans: list[Span]
    llm_calls: list[TrainableCall]
    rewards: list[Reward]

    def with_rewards(self, rewards: list[Reward]) -> TrainableRollout:
        return replace(self, rewards=rewards)


# A call's columns as the store selects them and the wire format lists them: TrainableCall's field order, with
# the answer message as its JSON text
CALL_COLUMNS = (
    "id",
    "rollout_id",
    "attempt_id",
    "seq",
    "agent_name",
    "agent_key",
    "attribution",
    "status",
    "trainable",
    "not_trainable_reason",
    "model_version",
    "temperature",
    "started_at",
    "latency_s",
    "prompt_ids",
    "response_ids",
    "logprobs",
    "response_message",
)
# a call's packed arrays, and where they sit among its CALL_COLUMNS values (each form of the read encodes them
# its own way)
ARRAYS = ("prompt_ids", "response_ids", "logprobs")
ARRAY_COLUMNS = slice(CALL_COLUMNS.index(ARRAYS[0]), CALL_COLUMNS.index(ARRAYS[-1]) + 1)
_ATTRIBUTION = {m.value: m for m in Attribution}


def call_values(c: TrainableCall) -> list[Any]:
    """A call's CALL_COLUMNS values in order, as `call_from_columns` takes them back: the attribution as its
    value, the answer as its JSON text, the arrays as they are."""
    return [
        c.id,
        c.rollout_id,
        c.attempt_id,
        c.seq,
        c.agent_name,
        c.agent_key,
        c.attribution.value,
        c.status,
        c.trainable,
        c.not_trainable_reason,
        c.model_version,
        c.temperature,
        c.started_at,
        c.latency_s,
        c.prompt_ids,
        c.response_ids,
        c.logprobs,
        c.response_json,
    ]


def call_from_columns(
    row: Sequence[Any], prompt_ids: array[int] | None, response_ids: array[int] | None, logprobs: array[float] | None
) -> TrainableCall:
    """A call from its CALL_COLUMNS values, its token ids and log-probs already unpacked (each source holds
    them in its own form: BLOBs in the store, base64 on the wire)."""
    return TrainableCall(
        row[0],
        row[1],
        row[2],
        row[3],
        row[4],
        row[5],
        _ATTRIBUTION[row[6]],
        row[7],
        bool(row[8]),
        row[9],
        row[10],
        row[11],
        row[12],
        row[13],
        prompt_ids,
        response_ids,
        logprobs,
        row[17],
    )
