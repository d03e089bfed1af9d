"""The training read over HTTP (`POST /api/v1/rollouts/trainable`) in its two forms: binary for agl's trainer,
JSON for any other client.

**Binary** (`BINARY_TYPE`, asked for with `Accept`): the answer is the trainer's input, so it is shaped for
decoding speed. The rollouts, tasks (each once), spans and rewards are one JSON array each, validated by
pydantic in one call per array (its parser reads the bytes directly); the calls are the rows of agl.common.call_packs,
one array per rollout; every call's token ids and log-probs are two raw little-endian sections, read into two
packed arrays in one copy each and sliced from there, prompts held as what they add to an earlier call's. JSON
text with base64 was a 25 MB body for 8,000 calls, decoded at ~30,000 calls/s; this one is a fifth of the size
and decodes several times as fast (`benchmarks/perf/bench_credit.py`, "over HTTP"). Msgpack or Arrow IPC would
have added a dependency and still needed the models validated and the arrays copied; most of the body is two
arrays, which need no format at all.

    magic "AGLTRB1\\n" | 7 section lengths (uint64 LE) | rollouts | tasks | spans | rewards | calls | ids | log-probs
    | CRC-32 of all before it (uint32 LE)

A body cut short, padded, or with any byte changed is refused with `WireError` naming what is wrong, before any
of it is used.

**JSON** (`JSON_TYPE`): the models as their JSON, each call's arrays as base64 of their little-endian bytes (no
token id is ever a JSON number).
"""

from __future__ import annotations

import base64
import struct
import zlib
from array import array
from collections.abc import Sequence
from typing import Any

import orjson
from pydantic import TypeAdapter, ValidationError

from agl.common.call_packs import PackError, pack_calls, unpack_calls
from agl.common.gc_pause import gc_paused
from agl.common.packed import FLOAT64, INT32, array_bytes, floats_array, ids_array
from agl.common.trainable import ARRAY_COLUMNS, TrainableCall, TrainableRollout, call_from_columns, call_values
from agl.schema import Reward, Rollout, Span, Task

BINARY_TYPE = "application/vnd.agl.trainable"
JSON_TYPE = "application/json"


class WireError(ValueError):
    """A training-read body that cannot be decoded: cut short, corrupted, or not agl's."""


# ---------------------------------------------------------------------------------------------------- binary

_MAGIC = b"AGLTRB1\n"
_SECTIONS = ("rollouts", "tasks", "spans", "rewards", "calls", "ids", "log-probs")
_HEADER = struct.Struct(f"<8s{len(_SECTIONS)}Q")
_CRC = struct.Struct("<I")
_ID_BYTES, _FLOAT_BYTES = array(INT32).itemsize, array(FLOAT64).itemsize

_rollout_list = TypeAdapter(list[Rollout])
_task_list = TypeAdapter(list[Task])
_span_lists = TypeAdapter(list[list[Span]])
_reward_lists = TypeAdapter(list[list[Reward]])


def to_binary(rollouts: Sequence[TrainableRollout]) -> bytes:
    """The binary body of these rollouts (each rollout's calls belong to its final attempt)."""
    tasks = {r.task.id: r.task for r in rollouts}
    ids: array[int] = array(INT32)
    floats: array[float] = array(FLOAT64)
    call_rows: list[list[list[Any]]] = []
    for r in rollouts:
        rows, call_ids, call_floats = pack_calls(r.llm_calls)
        call_rows.append(rows)
        ids.extend(call_ids)
        floats.extend(call_floats)
    sections = (
        _rollout_list.dump_json([r.rollout for r in rollouts]),
        _task_list.dump_json(list(tasks.values())),
        _span_lists.dump_json([r.spans for r in rollouts]),
        _reward_lists.dump_json([r.rewards for r in rollouts]),
        orjson.dumps(call_rows),
        array_bytes(ids),
        array_bytes(floats),
    )
    body = b"".join((_HEADER.pack(_MAGIC, *map(len, sections)), *sections))
    return body + _CRC.pack(zlib.crc32(body))


def from_binary(body: bytes) -> list[TrainableRollout]:
    """The rollouts `to_binary` wrote. Raises WireError for a body cut short, changed, or not agl's."""
    with gc_paused():  # tens of thousands of new objects, none of them in a cycle (agl.common.gc_pause)
        return _from_binary(body)


def _from_binary(body: bytes) -> list[TrainableRollout]:
    sections = _sections(body)
    try:
        rollouts = _rollout_list.validate_json(sections[0])
        tasks = {t.id: t for t in _task_list.validate_json(sections[1])}
        spans = _span_lists.validate_json(sections[2])
        rewards = _reward_lists.validate_json(sections[3])
        call_rows = orjson.loads(sections[4])
    except (ValidationError, orjson.JSONDecodeError) as e:
        raise WireError(f"the training read's body holds records that are not valid: {e}") from e
    if not len(rollouts) == len(spans) == len(rewards) == len(call_rows):
        raise WireError(
            f"the training read's body holds {len(rollouts)} rollouts but spans, rewards and calls for"
            f" {len(spans)}, {len(rewards)} and {len(call_rows)}"
        )
    if len(sections[5]) % _ID_BYTES or len(sections[6]) % _FLOAT_BYTES:
        raise WireError("the training read's body holds token ids or log-probs cut mid-number")
    ids, floats = ids_array(sections[5]), floats_array(sections[6])
    out: list[TrainableRollout] = []
    at = fat = 0
    try:
        for rollout, rollout_spans, rollout_rewards, rows in zip(rollouts, spans, rewards, call_rows, strict=True):
            task = tasks.get(rollout.task_id)
            if task is None:
                raise WireError(f"the training read's body holds rollout {rollout.id} without its task")
            calls: list[TrainableCall] = []
            if rows:
                if rollout.final_attempt_id is None:
                    raise WireError(
                        f"the training read's body holds calls of rollout {rollout.id}, which has no attempt"
                    )
                calls, at, fat = unpack_calls(
                    rollout.id, rollout.final_attempt_id, rows, ids, floats, at, fat, where="the training read's body"
                )
            out.append(TrainableRollout(rollout, task, rollout_spans, calls, rollout_rewards))
    except (PackError, KeyError, TypeError, ValueError) as e:
        if isinstance(e, WireError):
            raise
        raise WireError(f"the training read's body holds calls that are not valid: {e!r}") from e
    if at != len(ids) or fat != len(floats):
        raise WireError(
            f"the training read's body holds {len(ids) - at} token ids and {len(floats) - fat} log-probs that no"
            " call names"
        )
    return out


def _sections(body: bytes) -> list[bytes]:
    """The body's sections, once its magic, length and checksum are right."""
    if len(body) < _HEADER.size + _CRC.size:
        raise WireError(f"the training read's body is cut short: {len(body)} bytes, less than its header")
    magic, *lengths = _HEADER.unpack_from(body)
    if magic != _MAGIC:
        what = "another version of agl's" if magic[:6] == _MAGIC[:6] else "not agl's binary"
        raise WireError(f"the training read's body is {what} (it starts with {magic!r}, this client reads {_MAGIC!r})")
    expected = _HEADER.size + sum(lengths) + _CRC.size
    if len(body) != expected:
        how = "cut short" if len(body) < expected else "longer than its header says"
        raise WireError(f"the training read's body is {how}: {len(body)} bytes, its header says {expected}")
    (crc,) = _CRC.unpack_from(body, len(body) - _CRC.size)
    if zlib.crc32(memoryview(body)[: -_CRC.size]) != crc:
        raise WireError("the training read's body is corrupted: its checksum does not match its bytes")
    out: list[bytes] = []
    at = _HEADER.size
    for n in lengths:
        out.append(body[at : at + n])
        at += n
    return out


# ------------------------------------------------------------------------------------------------------ JSON

_rollout = TypeAdapter(Rollout)
_task = TypeAdapter(Task)
_spans = TypeAdapter(list[Span])
_rewards = TypeAdapter(list[Reward])


def _b64(values: array[Any] | None) -> str | None:
    return None if values is None else base64.b64encode(array_bytes(values)).decode("ascii")


def _ids(text: str | None) -> array[int] | None:
    return None if text is None else ids_array(base64.b64decode(text))


def _floats(text: str | None) -> array[float] | None:
    return None if text is None else floats_array(base64.b64decode(text))


def _json_call(c: TrainableCall) -> list[Any]:
    """A call in CALL_COLUMNS order, its arrays as base64."""
    values = call_values(c)
    values[ARRAY_COLUMNS] = map(_b64, values[ARRAY_COLUMNS])
    return values


def to_json(rollouts: Sequence[TrainableRollout]) -> bytes:
    """JSON for any client: models as their JSON, each call as its CALL_COLUMNS (agl.common.trainable) with the packed
    arrays as base64 of their little-endian bytes."""
    return orjson.dumps(
        [
            {
                "rollout": r.rollout.model_dump(mode="json"),
                "task": r.task.model_dump(mode="json"),
                "spans": [s.model_dump(mode="json") for s in r.spans],
                "rewards": [w.model_dump(mode="json") for w in r.rewards],
                "llm_calls": [_json_call(c) for c in r.llm_calls],
            }
            for r in rollouts
        ]
    )


def from_json(body: bytes | str) -> list[TrainableRollout]:
    """The rollouts `to_json` wrote (its models validated again)."""
    with gc_paused():
        return _from_json(body)


def _from_json(body: bytes | str) -> list[TrainableRollout]:
    out: list[TrainableRollout] = []
    for item in orjson.loads(body):
        calls = []
        for row in item["llm_calls"]:
            prompt, response, logprobs = row[ARRAY_COLUMNS]
            calls.append(call_from_columns(row, _ids(prompt), _ids(response), _floats(logprobs)))
        out.append(
            TrainableRollout(
                rollout=_rollout.validate_python(item["rollout"]),
                task=_task.validate_python(item["task"]),
                spans=_spans.validate_python(item["spans"]),
                llm_calls=calls,
                rewards=_rewards.validate_python(item["rewards"]),
            )
        )
    return out


# -------------------------------------------------------------------------------------------------- choosing


def encode(rollouts: Sequence[TrainableRollout], accept: str | None) -> tuple[bytes, str]:
    """The body and its media type for a client that sent this `Accept` header: binary when it names it."""
    if accept and BINARY_TYPE in accept:
        return to_binary(rollouts), BINARY_TYPE
    return to_json(rollouts), JSON_TYPE


def decode(body: bytes, content_type: str | None) -> list[TrainableRollout]:
    """The rollouts of an answer in either form (a server from before the binary form answers JSON)."""
    if content_type and content_type.split(";")[0].strip() == BINARY_TYPE:
        return from_binary(body)
    return from_json(body)
