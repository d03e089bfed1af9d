"""A succeeded attempt's LLM calls and rewards packed into one row, for the training read (schema 7).

The training read (`agl.store.reads.trainable_rollouts`) takes, for each rollout, its final attempt's calls and
rewards. Read from their own tables that is one row per call and per reward, and sqlite3 makes a Python object
of every column of every row: with ~20 columns a call, that was most of the read's time. Once an attempt has
succeeded its calls and rewards seldom change, so the writer packs them, in the transaction that records the
success, into one row: the calls' training columns and the rewards as two JSON arrays (orjson decodes each in
one go), their token ids and log-probs as two BLOBs.

The rows stay where they are (every other read uses them), so a pack is a second copy, and the writer keeps it
in step: the transaction that adds a call or a reward to a succeeded attempt, or marks its calls' attribution,
packs it again. Attempts without a pack are read from the rows: attempts that did not succeed, those that
succeeded before schema 7, and those holding token ids as JSON text (before schema 4).
"""

from __future__ import annotations

import sqlite3
from array import array
from typing import Any

import orjson

from agl.common.call_packs import PACKED_CALL_COLUMNS, unpack_calls
from agl.common.packed import BIG_ENDIAN, FLOAT64, INT32
from agl.common.trainable import ARRAYS, TrainableCall
from agl.schema import Reward
from agl.store.rows import REWARD_SOURCES, trusted
from agl.store.schema import REWARD_COLUMNS, columns

_ID_BYTES, _FLOAT_BYTES = 4, 8  # agl.common.packed's int32 and float64
# the call columns a pack keeps (agl.common.call_packs): the rows' columns up to the counts of the call's ids in the
# pack's BLOBs, which are worked out from the BLOBs
_CALL_COLUMNS = PACKED_CALL_COLUMNS[: PACKED_CALL_COLUMNS.index("n_prompt")]
_SELECT_CALLS = f"SELECT {columns(_CALL_COLUMNS + ARRAYS)} FROM llm_calls WHERE attempt_id=? ORDER BY seq"
_METADATA = REWARD_COLUMNS.index("metadata")
_SELECT_REWARDS = (
    f"SELECT {columns(REWARD_COLUMNS)} FROM rewards WHERE rollout_id=? AND attempt_id=? ORDER BY timestamp, id"
)
_UPSERT = (
    "INSERT OR REPLACE INTO attempt_packs (attempt_id, rollout_id, calls, rewards, ids, logprobs)"
    " VALUES (?, ?, ?, ?, ?, ?)"
)
_N = len(_CALL_COLUMNS)


def pack(conn: sqlite3.Connection, attempt_id: str, rollout_id: str) -> None:
    """(Re)write the attempt's pack from its rows; an attempt whose ids are JSON text gets none."""
    calls: list[list[Any]] = []
    ids: list[bytes] = []
    floats: list[bytes] = []
    for row in conn.execute(_SELECT_CALLS, (attempt_id,)):
        values = list(row)
        prompt, response, logprobs = values[_N:]
        if str in (type(prompt), type(response), type(logprobs)):
            conn.execute("DELETE FROM attempt_packs WHERE attempt_id=?", (attempt_id,))
            return
        del values[_N:]
        values.append(None if prompt is None else len(prompt) // _ID_BYTES)
        values.append(None if response is None else len(response) // _ID_BYTES)
        values.append(None if logprobs is None else len(logprobs) // _FLOAT_BYTES)
        ids += (prompt or b"", response or b"")
        floats.append(logprobs or b"")
        calls.append(values)
    # each reward as an object of its fields in field order: decoded, it is the model's __dict__ as it stands
    rewards: list[dict[str, Any]] = []
    for row in conn.execute(_SELECT_REWARDS, (rollout_id, attempt_id)):
        values = list(row)
        values[_METADATA] = orjson.Fragment(values[_METADATA])  # already JSON text
        rewards.append(dict(zip(REWARD_COLUMNS, values, strict=True)))
    conn.execute(
        _UPSERT,
        (attempt_id, rollout_id, orjson.dumps(calls), orjson.dumps(rewards), b"".join(ids), b"".join(floats)),
    )


def repack_if_packed(conn: sqlite3.Connection, attempt_id: str) -> None:
    """Pack the attempt again if it has a pack (something of it changed after it succeeded)."""
    row = conn.execute("SELECT rollout_id FROM attempt_packs WHERE attempt_id=?", (attempt_id,)).fetchone()
    if row is not None:
        pack(conn, attempt_id, row[0])


def _whole(code: str, blob: bytes) -> array[Any]:
    values = array(code, blob)
    if BIG_ENDIAN:
        values.byteswap()
    return values


def unpack_attempt(rollout_id: str, attempt_id: str, calls: bytes, ids: bytes, logprobs: bytes) -> list[TrainableCall]:
    """The pack's calls, in seq order, as the training read hands them on (prompts rebuilt whole): one conversion
    per BLOB, then block copies (agl.common.call_packs)."""
    found, _, _ = unpack_calls(
        rollout_id,
        attempt_id,
        orjson.loads(calls),
        _whole(INT32, ids),
        _whole(FLOAT64, logprobs),
        where="the store's attempt pack",
    )
    return found


def unpack_rewards(rewards: bytes) -> list[Reward]:
    """The pack's rewards, in the order the rows are read (time, then id)."""
    out: list[Reward] = []
    for d in orjson.loads(rewards):
        d["source"] = REWARD_SOURCES[d["source"]]
        out.append(trusted(Reward, d))
    return out
