"""Writing the records runs produce: tasks, spans, LLM calls, rewards and model versions (functions of the
writer's connection; `agl.store.lifecycle` holds the rules about who may still report)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from agl.schema import AttemptStatus, ModelVersion, ModelVersionIn, RewardIn, Task, TaskIn
from agl.store import rows
from agl.store.attempt_packs import repack_if_packed
from agl.store.codec import dumps, loads
from agl.store.errors import ConflictError
from agl.store.ids import new_id
from agl.store.prompt_bases import against_base
from agl.store.schema import (
    LLM_CALL_COLUMNS,
    PROMPT_BASE_COLUMNS,
    REWARD_COLUMNS,
    SPAN_COLUMNS,
    TASK_COLUMNS,
    columns,
    insert_sql,
)

_INSERT_TASK = insert_sql("tasks", TASK_COLUMNS)
# OTLP exporters re-send on timeouts: the (trace_id, span_id) key makes a re-sent span a no-op.
_INSERT_SPAN = insert_sql("spans", SPAN_COLUMNS, verb="INSERT OR IGNORE")
_INSERT_LLM_CALL = insert_sql("llm_calls", LLM_CALL_COLUMNS + PROMPT_BASE_COLUMNS)
# a reward's uid (made by the client) makes a re-sent reward a no-op
_INSERT_REWARD = insert_sql("rewards", REWARD_COLUMNS[:-1], verb="INSERT OR IGNORE")
_INSERT_MODEL_VERSION = insert_sql(
    "model_versions", ("name", "upstream_model", "metadata", "created_at", "agent_models")
)
_ATTEMPT_ID = LLM_CALL_COLUMNS.index("attempt_id")
_SEQ = LLM_CALL_COLUMNS.index("seq")
_PROMPT_IDS = LLM_CALL_COLUMNS.index("prompt_ids")
_TRAINABLE = LLM_CALL_COLUMNS.index("trainable")
_NOT_TRAINABLE_REASON = LLM_CALL_COLUMNS.index("not_trainable_reason")


def insert_task(conn: sqlite3.Connection, task: TaskIn, now: float) -> Task:
    """Store a task; the same task sent twice is stored once, a different task under a taken id is refused."""
    task_id = task.id or new_id("task")
    try:
        conn.execute(_INSERT_TASK, (task_id, dumps(task.input), dumps(task.metadata), now))
    except sqlite3.IntegrityError as exc:
        existing = conn.execute(f"SELECT {columns(TASK_COLUMNS)} FROM tasks WHERE id=?", (task_id,)).fetchone()
        if existing is not None and loads(existing["input"]) == task.input:
            return rows.task(existing)  # the same task sent twice: idempotent
        raise ConflictError(f"task {task_id!r} already exists with a different input") from exc
    return Task(id=task_id, input=task.input, metadata=task.metadata, created_at=now)


def insert_spans(conn: sqlite3.Connection, values: Sequence[tuple[Any, ...]]) -> int:
    """Store spans (`rows.span_values`); returns how many were new."""
    return conn.executemany(_INSERT_SPAN, values).rowcount


def insert_llm_call(conn: sqlite3.Connection, values: tuple[Any, ...]) -> None:
    """Store one call (`rows.llm_call_values`); a trainable call whose attempt has already ended is kept, marked
    not trainable, and packed again with its attempt if that has a pack. Its prompt is stored against an earlier
    call's where it extends one (agl.store.prompt_bases). Unless its attempt succeeded it is one write statement:
    the writer runs it without a savepoint."""
    row = conn.execute("SELECT status FROM attempts WHERE id=?", (values[_ATTEMPT_ID],)).fetchone()
    ended = row is not None and row["status"] != AttemptStatus.running.value
    if ended and values[_TRAINABLE]:
        # it was under way when its attempt ended (the agent gave up, a lease expired): kept, not trained
        values = (
            *values[:_TRAINABLE],
            0,
            f"its attempt had ended ({row['status']}) before the call finished",
            *values[_NOT_TRAINABLE_REASON + 1 :],
        )
    prompt, base_seq, base_len = against_base(conn, values[_ATTEMPT_ID], values[_SEQ], values[_PROMPT_IDS])
    args = (*values[:_PROMPT_IDS], prompt, *values[_PROMPT_IDS + 1 :], base_seq, base_len)
    if row is None or row["status"] != AttemptStatus.succeeded.value:  # only a succeeded attempt has a pack
        conn.execute(_INSERT_LLM_CALL, args)
        return
    # a call of a succeeded attempt is packed again with it (agl.store.attempt_packs): both or neither, and the
    # writer runs this without a savepoint of its own
    conn.execute("SAVEPOINT late_call")
    try:
        conn.execute(_INSERT_LLM_CALL, args)
        repack_if_packed(conn, values[_ATTEMPT_ID])
    except BaseException:
        conn.execute("ROLLBACK TO late_call")
        conn.execute("RELEASE late_call")
        raise
    conn.execute("RELEASE late_call")


def mark_llm_call_abandoned(
    conn: sqlite3.Connection, attempt_id: str, seq: int, reason: str, http_status: int = 499
) -> bool:
    """The agent hung up before the whole answer of a call already stored reached it (499), or got an error
    instead of it (the proxy's translation failed: 502): the call stays, as not trainable with `reason` (an answer
    the agent never acted on is no sample of its policy). False: no such call."""
    marked = conn.execute(
        "UPDATE llm_calls SET status='error', http_status=?, error=?, trainable=0, not_trainable_reason=?"
        " WHERE attempt_id=? AND seq=?",
        (http_status, reason, reason, attempt_id, seq),
    ).rowcount
    if marked:
        repack_if_packed(conn, attempt_id)
    return bool(marked)


def insert_reward(conn: sqlite3.Connection, reward: RewardIn) -> None:
    conn.execute(_INSERT_REWARD, rows.reward_values(reward))


def insert_model_version(conn: sqlite3.Connection, mv: ModelVersionIn, now: float) -> ModelVersion:
    cur = conn.execute(
        _INSERT_MODEL_VERSION, (mv.name, mv.upstream_model, dumps(mv.metadata), now, dumps(mv.agent_models))
    )
    return ModelVersion(version=int(cur.lastrowid or 0), created_at=now, **mv.model_dump())
