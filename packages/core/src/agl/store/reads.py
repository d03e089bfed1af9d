"""Read queries, as functions of a (reader) connection: WAL lets them run beside the writer.

Rows that become records are fetched as plain tuples, in the column order of agl.store.schema, and mapped by
agl.store.rows; only the few answers used for decisions are read by column name.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from agl.common.gc_pause import gc_paused
from agl.common.packed import floats_array, ids_array
from agl.common.trainable import CALL_COLUMNS, TrainableCall, TrainableRollout, call_from_columns
from agl.schema import (
    SAMPLING_REASON_PREFIX,
    Attempt,
    AttemptStatus,
    Attribution,
    LLMCall,
    ModelVersion,
    Reward,
    Rollout,
    RolloutDetail,
    RolloutStatus,
    Span,
    Task,
)
from agl.store import rows
from agl.store.attempt_packs import unpack_attempt, unpack_rewards
from agl.store.errors import NotFoundError
from agl.store.prompt_bases import PromptBases
from agl.store.schema import (
    ATTEMPT_COLUMNS,
    LLM_CALL_COLUMNS,
    MODEL_VERSION_COLUMNS,
    PROMPT_BASE_COLUMNS,
    REWARD_COLUMNS,
    ROLLOUT_COLUMNS,
    SPAN_COLUMNS,
    TASK_COLUMNS,
    columns,
)

_TASKS = f"SELECT {columns(TASK_COLUMNS)} FROM tasks"
_ROLLOUTS = f"SELECT {columns(ROLLOUT_COLUMNS)} FROM rollouts"
_ATTEMPTS = f"SELECT {columns(ATTEMPT_COLUMNS)} FROM attempts"
_SPANS = f"SELECT {columns(SPAN_COLUMNS)} FROM spans"
_LLM_CALLS = f"SELECT {columns(LLM_CALL_COLUMNS + PROMPT_BASE_COLUMNS)} FROM llm_calls"
_REWARDS = f"SELECT {columns(REWARD_COLUMNS)} FROM rewards"
_CHUNK = 500  # ids per `IN (...)`: well under SQLite's limit on bound parameters


def _tuples(conn: sqlite3.Connection, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    cur = conn.cursor()
    cur.row_factory = None  # tuples: a sqlite3.Row per row costs more than the mapping that follows
    return cur.execute(sql, args).fetchall()


def _marks(n: int) -> str:
    return ",".join("?" * n)


def get_task(conn: sqlite3.Connection, task_id: str) -> Task:
    found = _tuples(conn, f"{_TASKS} WHERE id=?", (task_id,))
    if not found:
        raise NotFoundError(f"task {task_id!r} does not exist")
    return rows.task(found[0])


def get_rollout(conn: sqlite3.Connection, rollout_id: str) -> Rollout:
    found = _tuples(conn, f"{_ROLLOUTS} WHERE id=?", (rollout_id,))
    if not found:
        raise NotFoundError(f"rollout {rollout_id!r} does not exist")
    return rows.rollout(found[0])


def get_rollouts(conn: sqlite3.Connection, ids: Sequence[str]) -> list[Rollout]:
    if not ids:
        return []
    return [rows.rollout(r) for r in _tuples(conn, f"{_ROLLOUTS} WHERE id IN ({_marks(len(ids))})", tuple(ids))]


def list_rollouts(
    conn: sqlite3.Connection, *, status: str | None = None, step: int | None = None, limit: int = 100, offset: int = 0
) -> tuple[list[Rollout], int]:
    where: list[str] = []
    args: list[Any] = []
    if status is not None:
        where.append("status=?")
        args.append(status)
    if step is not None:
        where.append("step=?")
        args.append(step)
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    total = conn.execute(f"SELECT COUNT(*) FROM rollouts{clause}", args).fetchone()[0]
    found = _tuples(conn, f"{_ROLLOUTS}{clause} ORDER BY created_at, rowid LIMIT ? OFFSET ?", (*args, limit, offset))
    return [rows.rollout(r) for r in found], int(total)


def status_counts(conn: sqlite3.Connection) -> dict[str, int]:
    return dict(_tuples(conn, "SELECT status, COUNT(*) FROM rollouts GROUP BY status"))


def attempts(conn: sqlite3.Connection, rollout_id: str) -> list[Attempt]:
    return [rows.attempt(r) for r in _tuples(conn, f"{_ATTEMPTS} WHERE rollout_id=? ORDER BY number", (rollout_id,))]


def spans(conn: sqlite3.Connection, rollout_id: str) -> list[Span]:
    return [rows.span(r) for r in _tuples(conn, f"{_SPANS} WHERE rollout_id=? ORDER BY start_time", (rollout_id,))]


def llm_calls(conn: sqlite3.Connection, rollout_id: str, attempt_id: str | None = None) -> list[LLMCall]:
    if attempt_id is None:
        found = _tuples(conn, f"{_LLM_CALLS} WHERE rollout_id=? ORDER BY attempt_id, seq", (rollout_id,))
    else:
        found = _tuples(
            conn, f"{_LLM_CALLS} WHERE rollout_id=? AND attempt_id=? ORDER BY seq", (rollout_id, attempt_id)
        )
    return list(map(rows.llm_call_reader(), found))


def rewards(conn: sqlite3.Connection, rollout_id: str) -> list[Reward]:
    return [
        rows.reward(r) for r in _tuples(conn, f"{_REWARDS} WHERE rollout_id=? ORDER BY timestamp, id", (rollout_id,))
    ]


def _detail(
    rollout: Rollout,
    task: Task,
    attempts: list[Attempt],
    spans: list[Span],
    llm_calls: list[LLMCall],
    rewards: list[Reward],
) -> RolloutDetail:
    values = {"rollout": rollout, "task": task, "attempts": attempts, "spans": spans}
    values.update(llm_calls=llm_calls, rewards=rewards)
    return rows.trusted(RolloutDetail, values)


def rollout_detail(conn: sqlite3.Connection, rollout_id: str) -> RolloutDetail:
    rollout = get_rollout(conn, rollout_id)
    return _detail(
        rollout,
        get_task(conn, rollout.task_id),
        attempts(conn, rollout_id),
        spans(conn, rollout_id),
        llm_calls(conn, rollout_id),
        rewards(conn, rollout_id),
    )


def rollout_details(conn: sqlite3.Connection, rollout_ids: Sequence[str]) -> list[RolloutDetail]:
    """`rollout_detail` of many rollouts in a few queries (the trainer's read path); unknown ids are skipped."""
    out: list[RolloutDetail] = []
    for start in range(0, len(rollout_ids), _CHUNK):
        chunk = list(rollout_ids[start : start + _CHUNK])
        where = f"rollout_id IN ({_marks(len(chunk))})"
        found = {
            r.id: r for r in map(rows.rollout, _tuples(conn, f"{_ROLLOUTS} WHERE id IN ({_marks(len(chunk))})", chunk))
        }
        task_ids = sorted({r.task_id for r in found.values()})
        tasks = {
            t.id: t for t in map(rows.task, _tuples(conn, f"{_TASKS} WHERE id IN ({_marks(len(task_ids))})", task_ids))
        }
        # (attempts, spans, LLM calls, rewards) of each rollout found; rows naming another rollout are skipped
        parts: dict[str | None, tuple[list[Attempt], list[Span], list[LLMCall], list[Reward]]] = {
            rid: ([], [], [], []) for rid in found
        }
        for a in map(rows.attempt, _tuples(conn, f"{_ATTEMPTS} WHERE {where} ORDER BY number", chunk)):
            if (part := parts.get(a.rollout_id)) is not None:
                part[0].append(a)
        for s in map(rows.span, _tuples(conn, f"{_SPANS} WHERE {where} ORDER BY start_time", chunk)):
            if (part := parts.get(s.rollout_id)) is not None:
                part[1].append(s)
        # in the index's order (rollout, attempt, seq): no sort, and each call follows the one before it in its
        # attempt, which lets it share its prompt's ints
        calls = _tuples(conn, f"{_LLM_CALLS} WHERE {where} ORDER BY rollout_id, attempt_id, seq", chunk)
        for c in map(rows.llm_call_reader(), calls):
            if (part := parts.get(c.rollout_id)) is not None:
                part[2].append(c)
        for r in map(rows.reward, _tuples(conn, f"{_REWARDS} WHERE {where} ORDER BY timestamp, id", chunk)):
            if (part := parts.get(r.rollout_id)) is not None:
                part[3].append(r)
        for rid in chunk:
            if rid in found:
                rollout = found[rid]
                out.append(_detail(rollout, tasks[rollout.task_id], *parts[rid]))
    return out


_TRAINABLE_CALLS = f"SELECT {columns(CALL_COLUMNS + PROMPT_BASE_COLUMNS)} FROM llm_calls"
_ATTEMPT, _SEQ, _PROMPT, _RESPONSE, _LOGPROBS, _BASE_SEQ = (
    CALL_COLUMNS.index("attempt_id"),
    CALL_COLUMNS.index("seq"),
    CALL_COLUMNS.index("prompt_ids"),
    CALL_COLUMNS.index("response_ids"),
    CALL_COLUMNS.index("logprobs"),
    len(CALL_COLUMNS),
)


_Part = tuple[list[Span], list[TrainableCall], list[Reward]]  # an attempt's spans, calls and rewards
_PACKS = "SELECT attempt_id, rollout_id, calls, rewards, ids, logprobs FROM attempt_packs"


def _trainable_call(row: tuple[Any, ...], bases: PromptBases) -> TrainableCall:
    """A call from its row (CALL_COLUMNS, then PROMPT_BASE_COLUMNS), read in (attempt, seq) order."""
    response, logprobs = row[_RESPONSE], row[_LOGPROBS]
    prompt = bases.whole(row[_ATTEMPT], row[_SEQ], row[_PROMPT], response, *row[_BASE_SEQ:])
    floats = None if logprobs is None else floats_array(logprobs)
    try:
        prompt_ids = None if prompt is None else ids_array(prompt)
        response_ids = None if response is None else ids_array(response)
    except (OverflowError, TypeError, ValueError):  # JSON text holding what no int32 holds: no token ids at all
        call = call_from_columns(row, None, None, floats)
        call.trainable, call.not_trainable_reason = False, "token ids that are not int32"
        return call
    return call_from_columns(row, prompt_ids, response_ids, floats)


def trainable_rollouts(conn: sqlite3.Connection, rollout_ids: Sequence[str]) -> list[TrainableRollout]:
    """What training reads of these rollouts (agl.common.trainable): each with the spans, LLM calls and rewards of its
    final attempt, token ids kept packed. Unknown ids are skipped; a rollout with no final attempt has none."""
    out: list[TrainableRollout] = []
    with gc_paused():
        for start in range(0, len(rollout_ids), _CHUNK):
            out += _trainable_chunk(conn, list(rollout_ids[start : start + _CHUNK]))
    return out


def _trainable_chunk(conn: sqlite3.Connection, chunk: list[str]) -> list[TrainableRollout]:
    in_chunk = f"IN ({_marks(len(chunk))})"
    found = {r.id: r for r in map(rows.rollout, _tuples(conn, f"{_ROLLOUTS} WHERE id {in_chunk}", chunk))}
    task_ids = sorted({r.task_id for r in found.values()})
    tasks = {
        t.id: t for t in map(rows.task, _tuples(conn, f"{_TASKS} WHERE id IN ({_marks(len(task_ids))})", task_ids))
    }
    finals = sorted({r.final_attempt_id for r in found.values() if r.final_attempt_id is not None})
    # (spans, calls, rewards) of each final attempt
    parts: dict[str, _Part] = {}
    if finals:
        # packed attempts (agl.store.attempt_packs): one row each; the others from their calls' and rewards' rows
        for attempt_id, rollout_id, calls, rewards, ids, logprobs in _tuples(
            conn, f"{_PACKS} WHERE attempt_id IN ({_marks(len(finals))})", finals
        ):
            parts[attempt_id] = (
                [],
                unpack_attempt(rollout_id, attempt_id, calls, ids, logprobs),
                unpack_rewards(rewards),
            )
        unpacked = {a: r.id for r in found.values() if (a := r.final_attempt_id) is not None and a not in parts}
        if unpacked:
            parts.update(_unpacked_attempts(conn, unpacked))
        # spans are indexed by rollout: the chunk's are read, the final attempts' kept
        for s in map(rows.span, _tuples(conn, f"{_SPANS} WHERE rollout_id {in_chunk} ORDER BY start_time", chunk)):
            if s.attempt_id is not None and (part := parts.get(s.attempt_id)) is not None:
                part[0].append(s)
    return [
        TrainableRollout(r, tasks[r.task_id], *(parts.get(r.final_attempt_id or "") or ([], [], [])))
        for rid in chunk
        if (r := found.get(rid)) is not None
    ]


def _unpacked_attempts(conn: sqlite3.Connection, rollout_of: dict[str, str]) -> dict[str, _Part]:
    """(spans, calls, rewards) of these attempts (attempt → rollout) read from their rows, spans left empty."""
    parts: dict[str, _Part] = {a: ([], [], []) for a in rollout_of}
    attempts = sorted(rollout_of)
    # the (attempt_id, seq) index gives each attempt's calls in order
    calls = _tuples(
        conn, f"{_TRAINABLE_CALLS} WHERE attempt_id IN ({_marks(len(attempts))}) ORDER BY attempt_id, seq", attempts
    )
    bases = PromptBases()
    for row in calls:
        call = _trainable_call(row, bases)
        parts[call.attempt_id][1].append(call)
    # rewards are indexed by rollout: the rollouts' are read, these attempts' kept
    rollout_ids = sorted(set(rollout_of.values()))
    for w in map(
        rows.reward,
        _tuples(
            conn, f"{_REWARDS} WHERE rollout_id IN ({_marks(len(rollout_ids))}) ORDER BY timestamp, id", rollout_ids
        ),
    ):
        if (part := parts.get(w.attempt_id)) is not None:
            part[2].append(w)
    return parts


def iter_final_llm_calls(conn: sqlite3.Connection, *, step: int | None = None) -> Iterator[tuple[Rollout, LLMCall]]:
    """LLM calls of the final attempt of every succeeded rollout: the calls that may become transitions."""
    args: tuple[Any, ...] = (RolloutStatus.succeeded.value,)
    clause = ""
    if step is not None:
        clause, args = " AND r.step=?", (*args, step)
    cur = conn.cursor()
    cur.row_factory = None
    found = cur.execute(
        f"SELECT r.id, {columns(LLM_CALL_COLUMNS + PROMPT_BASE_COLUMNS, 'c')} FROM rollouts r JOIN llm_calls c"
        f" ON c.attempt_id = r.final_attempt_id WHERE r.status=?{clause} ORDER BY r.created_at, r.rowid, c.seq",
        args,
    )
    read = rows.llm_call_reader()
    rollout: Rollout | None = None
    for row in found:
        if rollout is None or rollout.id != row[0]:
            rollout = get_rollout(conn, row[0])
        yield rollout, read(row[1:])


def counts(conn: sqlite3.Connection) -> dict[str, int]:
    return {
        table: int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
        for table in ("tasks", "rollouts", "attempts", "spans", "llm_calls", "rewards")
    }


def unknown_rollouts(conn: sqlite3.Connection, ids: Iterable[str | None]) -> set[str]:
    """Which of these rollout ids do not exist (None is not an id: spans may belong to no rollout)."""
    wanted = sorted({i for i in ids if i is not None})
    found: set[str] = set()
    for start in range(0, len(wanted), _CHUNK):
        chunk = wanted[start : start + _CHUNK]
        found.update(r[0] for r in conn.execute(f"SELECT id FROM rollouts WHERE id IN ({_marks(len(chunk))})", chunk))
    return set(wanted) - found


def latest_model_version(conn: sqlite3.Connection) -> ModelVersion | None:
    found = _tuples(conn, f"SELECT {columns(MODEL_VERSION_COLUMNS)} FROM model_versions ORDER BY version DESC LIMIT 1")
    return rows.model_version(found[0]) if found else None


def max_llm_seq(conn: sqlite3.Connection, attempt_id: str) -> int | None:
    """The highest sequence number of the attempt's stored LLM calls (None: it has none)."""
    value = conn.execute("SELECT MAX(seq) FROM llm_calls WHERE attempt_id=?", (attempt_id,)).fetchone()[0]
    return None if value is None else int(value)


def missed_attribution(conn: sqlite3.Connection, attempt_id: str) -> int:
    row = conn.execute(
        "SELECT count(*) FROM llm_calls WHERE attempt_id=? AND attribution=?", (attempt_id, Attribution.missed.value)
    ).fetchone()
    return int(row[0])


def untrainable_sampling(
    conn: sqlite3.Connection, rollout_id: str, attempt_id: str
) -> list[tuple[str | None, int, str]]:
    """(agent, calls, one of their reasons) for the attempt's calls stored not trainable for how they were sampled."""
    found = conn.execute(
        "SELECT agent_name, count(*), min(not_trainable_reason) FROM llm_calls WHERE rollout_id=? AND attempt_id=?"
        " AND trainable=0 AND substr(not_trainable_reason, 1, ?)=? GROUP BY agent_name ORDER BY agent_name",
        (rollout_id, attempt_id, len(SAMPLING_REASON_PREFIX), SAMPLING_REASON_PREFIX),
    ).fetchall()
    return [(agent, int(count), str(reason)) for agent, count, reason in found]


def attempt_state(conn: sqlite3.Connection, attempt_id: str) -> tuple[str, str, bool] | None:
    """(rollout id, mode, running) of an attempt, or None if there is no such attempt."""
    row = conn.execute(
        "SELECT a.rollout_id, r.mode, a.status FROM attempts a JOIN rollouts r ON r.id = a.rollout_id WHERE a.id=?",
        (attempt_id,),
    ).fetchone()
    if row is None:
        return None
    return str(row[0]), str(row[1]), row[2] == AttemptStatus.running.value
