"""An attempt's LLM calls as one list of rows and two packed arrays: the layout of the store's attempt packs
(agl.store.attempt_packs) and of the binary training read (agl.common.trainable_wire).

Each row holds a call's training columns (`PACKED_CALL_COLUMNS`) and how many ids and log-probs it has in the
arrays; the arrays hold every call's prompt ids then response ids (int32), and log-probs (float64), end to end
in the rows' order. A multi-turn agent's prompt repeats the chat so far, so a prompt that begins with an
earlier call's prompt (+ response) is held as the ids it adds and names that call (its base) and how many of
the base's ids come first; a call sharing less than half of its prompt is held whole. The store's packs take
their bases from its rows, where a base is always a call held whole (agl.store.prompt_bases); `pack_calls`
names the call just before, so each id of a chat is held once. The reader rebuilds either.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any

from agl.common.packed import FLOAT64, INT32
from agl.common.trainable import ARRAY_COLUMNS, ARRAYS, CALL_COLUMNS, TrainableCall, call_values
from agl.schema import Attribution

# a row: the training read's columns (agl.common.trainable) less the two ids rows are keyed by and the arrays, then the
# prompt's base, then the counts of the call's ids and log-probs in the arrays
PACKED_CALL_COLUMNS = (
    *(c for c in CALL_COLUMNS if c not in ("rollout_id", "attempt_id", *ARRAYS)),
    "prompt_base_seq",
    "prompt_base_len",
    "n_prompt",
    "n_response",
    "n_logprobs",
)
_ATTRIBUTIONS = {m.value: m for m in Attribution}
_KEYS_AT = slice(CALL_COLUMNS.index("rollout_id"), CALL_COLUMNS.index("attempt_id") + 1)


class PackError(ValueError):
    """Rows and arrays that do not fit together (a corrupt pack or body)."""


def pack_calls(calls: Sequence[TrainableCall]) -> tuple[list[list[Any]], array[int], array[float]]:
    """Rows (PACKED_CALL_COLUMNS) and the two arrays of an attempt's calls, given in `seq` order."""
    rows: list[list[Any]] = []
    ids: array[int] = array(INT32)
    floats: array[float] = array(FLOAT64)
    base: TrainableCall | None = None  # the latest call with a prompt
    for c in calls:
        prompt, response, logprobs = c.prompt_ids, c.response_ids, c.logprobs
        base_seq = base_len = None
        if prompt is not None and base is not None and base.prompt_ids is not None:
            shared = _shared(prompt, base.prompt_ids, base.response_ids)
            if 2 * shared >= len(prompt):
                base_seq, base_len, prompt = base.seq, shared, prompt[shared:]
        if prompt is not None:
            base = c
        row = call_values(c)
        del row[ARRAY_COLUMNS]  # the arrays, then the two ids the rows are keyed by
        del row[_KEYS_AT]
        row += (
            base_seq,
            base_len,
            None if prompt is None else len(prompt),
            None if response is None else len(response),
            None if logprobs is None else len(logprobs),
        )
        rows.append(row)
        ids.extend(prompt or ())
        ids.extend(response or ())
        floats.extend(logprobs or ())
    return rows, ids, floats


def _shared(prompt: array[int], base_prompt: array[int], base_response: array[int] | None) -> int:
    """How many ids the prompt shares with the start of the base's prompt (+ response): all of them or none."""
    n = len(base_prompt)
    if prompt[:n] != base_prompt:
        return 0
    if base_response and prompt[n : n + len(base_response)] == base_response:
        n += len(base_response)
    return n


def unpack_calls(
    rollout_id: str,
    attempt_id: str,
    rows: Sequence[Sequence[Any]],
    ids: array[int],
    floats: array[float],
    at: int = 0,
    fat: int = 0,
    *,
    where: str,
) -> tuple[list[TrainableCall], int, int]:
    """The calls of `rows`, their ids read from `ids[at:]` and log-probs from `floats[fat:]` (prompts rebuilt
    whole), and where the next attempt's ids and log-probs begin. Each call's arrays are block copies of slices.
    `where` names the source in errors."""
    out: list[TrainableCall] = []
    heads: dict[int, array[int]] = {}  # seq → whole prompt + response of each call with a prompt
    for row in rows:
        (
            call_id,
            seq,
            agent_name,
            agent_key,
            attribution,
            status,
            trainable,
            not_trainable_reason,
            model_version,
            temperature,
            started_at,
            latency_s,
            response_json,
            base_seq,
            base_len,
            n_prompt,
            n_response,
            n_logprobs,
        ) = row
        prompt = response = logprobs = None
        start = at
        if n_prompt is not None:
            at += n_prompt
            prompt = ids[start:at]
        if n_response is not None:
            response = ids[at : at + n_response]
            at += n_response
        if n_logprobs is not None:
            logprobs = floats[fat : fat + n_logprobs]
            fat += n_logprobs
        if at > len(ids) or fat > len(floats):
            raise PackError(
                f"{where}: LLM call {seq} of attempt {attempt_id} has ids or log-probs past the arrays' end"
            )
        if base_seq is None:
            if prompt is not None:
                heads[seq] = ids[start:at]
        else:
            head = heads.get(base_seq)
            if head is None or prompt is None or base_len is None or base_len > len(head):
                raise PackError(
                    f"{where}: LLM call {seq} of attempt {attempt_id} extends call {base_seq}'s prompt, which it"
                    " does not hold"
                )
            prompt = head[:base_len] + prompt
            heads[seq] = prompt + response if response is not None else prompt
        out.append(
            TrainableCall(
                call_id,
                rollout_id,
                attempt_id,
                seq,
                agent_name,
                agent_key,
                _ATTRIBUTIONS[attribution],
                status,
                trainable != 0,
                not_trainable_reason,
                model_version,
                temperature,
                started_at,
                latency_s,
                prompt,
                response,
                logprobs,
                response_json,
            )
        )
    return out, at, fat
