"""The life cycle of rollouts and their attempts, as functions of a connection inside a transaction.

    queued ──claim──▶ running ──complete(succeeded)──▶ succeeded
      ▲                  │
      └── retry ◀────────┤ complete(failed/timeout), lease or timeout expired (expire_leases)
                         └──▶ failed, once max_attempts attempts have failed;  cancel: ──▶ cancelled

A rollout is recorded once: only its latest attempt may complete it, and an attempt whose lease expired may
still report late while nobody else has picked its rollout up again. An attempt's first report stands: the same
report again is a no-op, one that disagrees with it is refused (ConflictError, 409). The functions take the time (`now`) and
return what they changed, including the attempts they ended (the store forgets what it kept about them), so
they can run, and be tested, on any connection with the store's tables.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence

from agl.common import failure
from agl.schema import (
    Attempt,
    AttemptStatus,
    Attribution,
    Claim,
    EnqueueRequest,
    RewardIn,
    RewardSource,
    Rollout,
    RolloutStatus,
)
from agl.store import rows
from agl.store.attempt_packs import pack, repack_if_packed
from agl.store.codec import dumps
from agl.store.errors import ConflictError, NotFoundError
from agl.store.ids import new_id
from agl.store.placement import place_unplaced, placed
from agl.store.records import insert_reward, insert_task
from agl.store.schema import ATTEMPT_COLUMNS, ROLLOUT_COLUMNS, TASK_COLUMNS, columns, insert_sql

# what an attempt's agent sent elsewhere than agl, as its runner reported it: (calls that bypassed agl, the first
# one's URL, calls to LLMs it named its own, of the bypassed those answered there, those refused)
Elsewhere = tuple[int, str | None, int, int | None, int | None]

_SELECT_ROLLOUT = f"SELECT {columns(ROLLOUT_COLUMNS)} FROM rollouts WHERE id=?"
_SELECT_ATTEMPT = f"SELECT {columns(ATTEMPT_COLUMNS)} FROM attempts WHERE id=?"
_SELECT_TASK = f"SELECT {columns(TASK_COLUMNS)} FROM tasks WHERE id=?"
_INSERT_ROLLOUT = insert_sql(
    "rollouts",
    ("id", "task_id", "mode", "step", "status", "attempt_count", "max_attempts", "timeout_s", "created_at", "metadata"),
)
_INSERT_ATTEMPT = insert_sql(
    "attempts",
    ("id", "rollout_id", "number", "worker_id", "status", "started_at", "heartbeat_at", "lease_expires_at"),
)
_QUEUED = RolloutStatus.queued.value
COMPLETION_REWARD = "final"  # the name of the reward a completion reports
# how the server words the attempts it ends itself (a late report may still come for those)
_TIMED_OUT = "ran past its timeout of"
_CANCELLED = "rollout cancelled"
_RUNNING = AttemptStatus.running.value  # the same word for a rollout and an attempt


def _rollout(conn: sqlite3.Connection, rollout_id: str) -> Rollout:
    return rows.rollout(conn.execute(_SELECT_ROLLOUT, (rollout_id,)).fetchone())


def latest_attempt_id(conn: sqlite3.Connection, rollout_id: str) -> str | None:
    row = conn.execute(
        "SELECT id FROM attempts WHERE rollout_id=? ORDER BY number DESC LIMIT 1", (rollout_id,)
    ).fetchone()
    return None if row is None else str(row["id"])


def enqueue(conn: sqlite3.Connection, req: EnqueueRequest, now: float) -> list[Rollout]:
    """`req.n` queued rollouts of an existing task (`req.task_id`) or a new one (`req.task`)."""
    if req.task is not None:
        task = insert_task(conn, req.task, now)
    else:
        row = conn.execute(_SELECT_TASK, (req.task_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"task {req.task_id!r} does not exist")
        task = rows.task(row)
    out = []
    for _ in range(req.n):
        rollout = Rollout(
            id=new_id("ro"),
            task_id=task.id,
            mode=req.mode,
            step=req.step,
            status=RolloutStatus.queued,
            attempt_count=0,
            max_attempts=req.max_attempts,
            timeout_s=req.timeout_s,
            created_at=now,
            started_at=None,
            ended_at=None,
            final_attempt_id=None,
            final_reward=None,
            error=None,
            metadata=req.metadata,
        )
        conn.execute(
            _INSERT_ROLLOUT,
            (
                rollout.id,
                task.id,
                req.mode,
                req.step,
                _QUEUED,
                0,
                req.max_attempts,
                req.timeout_s,
                now,
                dumps(req.metadata),
            ),
        )
        out.append(rollout)
    return out


def claim(conn: sqlite3.Connection, worker_id: str, max_rollouts: int, lease_s: float, now: float) -> list[Claim]:
    """Start an attempt on each of the oldest queued rollouts (at most `max_rollouts`), leased for `lease_s`.

    Evaluation rollouts go first: with rollouts overlapping updates the training rollouts of the next steps are
    already queued when an evaluation is, and the loop waits for the evaluation before it goes on."""
    queued = conn.execute(
        "SELECT id, task_id, attempt_count FROM rollouts WHERE status=?"
        " ORDER BY mode = 'train', created_at, rowid LIMIT ?",
        (_QUEUED, max_rollouts),
    ).fetchall()
    claims = []
    for row in queued:
        number = row["attempt_count"] + 1
        attempt = Attempt(
            id=new_id("at"),
            rollout_id=row["id"],
            number=number,
            worker_id=worker_id,
            status=AttemptStatus.running,
            started_at=now,
            heartbeat_at=now,
            lease_expires_at=now + lease_s,
            ended_at=None,
            error=None,
        )
        conn.execute(_INSERT_ATTEMPT, (attempt.id, row["id"], number, worker_id, _RUNNING, now, now, now + lease_s))
        conn.execute(
            "UPDATE rollouts SET status=?, attempt_count=?, started_at=COALESCE(started_at, ?) WHERE id=?",
            (RolloutStatus.running.value, number, now, row["id"]),
        )
        task = rows.task(conn.execute(_SELECT_TASK, (row["task_id"],)).fetchone())
        claims.append(Claim(rollout=_rollout(conn, row["id"]), attempt=attempt, task=task))
    return claims


def heartbeat(conn: sqlite3.Connection, attempt_id: str, lease_s: float, now: float) -> Attempt:
    """Extend a running attempt's lease to `now + lease_s`; an attempt that ended is told to stop."""
    row = conn.execute("SELECT status FROM attempts WHERE id=?", (attempt_id,)).fetchone()
    if row is None:
        raise NotFoundError(f"attempt {attempt_id!r} does not exist")
    if row["status"] != _RUNNING:
        raise ConflictError(f"attempt {attempt_id} is {row['status']}, not running: stop working on it")
    conn.execute("UPDATE attempts SET heartbeat_at=?, lease_expires_at=? WHERE id=?", (now, now + lease_s, attempt_id))
    return rows.attempt(conn.execute(_SELECT_ATTEMPT, (attempt_id,)).fetchone())


def retry_or_fail(conn: sqlite3.Connection, rollout: sqlite3.Row, reason: str, now: float) -> None:
    """Queue the rollout of a failed attempt again, or fail it once it has used up its attempts."""
    if rollout["attempt_count"] < rollout["max_attempts"]:
        conn.execute("UPDATE rollouts SET status=?, error=? WHERE id=?", (_QUEUED, reason, rollout["id"]))
    else:
        conn.execute(
            "UPDATE rollouts SET status=?, ended_at=?, error=? WHERE id=?",
            (
                RolloutStatus.failed.value,
                now,
                f"{reason} (attempt {rollout['attempt_count']} of {rollout['max_attempts']})",
                rollout["id"],
            ),
        )


def complete(
    conn: sqlite3.Connection,
    attempt_id: str,
    status: str,
    now: float,
    *,
    reward: float | None = None,
    error: str | None = None,
    after_llm_seq: int | None = None,
    agent_scopes: int | None = None,
    elsewhere: Elsewhere | None = None,
) -> tuple[Rollout, list[str]]:
    """Record an attempt's outcome once; a repeated identical report (same status, same reward) changes nothing,
    one that disagrees with the first (another status or reward) raises ConflictError and changes nothing either.
    An attempt the server ended itself (lease or timeout ran out) may still report late while nobody else has its
    rollout. Returns the rollout and the attempts this ended (none for a repeated report). `agent_scopes`,
    `elsewhere`: see `Store.complete`. The reward is placed after the attempt's last call (agl.store.placement)."""
    att = conn.execute("SELECT number, status, error, rollout_id FROM attempts WHERE id=?", (attempt_id,)).fetchone()
    if att is None:
        raise NotFoundError(f"attempt {attempt_id!r} does not exist")
    ro = conn.execute(
        "SELECT id, status, attempt_count, max_attempts FROM rollouts WHERE id=?", (att["rollout_id"],)
    ).fetchone()
    if agent_scopes:
        marked = conn.execute(
            "UPDATE llm_calls SET attribution=? WHERE attempt_id=? AND attribution=?",
            (Attribution.missed.value, attempt_id, Attribution.unhooked.value),
        ).rowcount
        if marked:
            repack_if_packed(conn, attempt_id)
    reported = att["status"] != _RUNNING and not _ended_by_server(att)
    if att["status"] == status:
        if reported and (first := _completion_reward(conn, ro["id"], attempt_id)) != reward:
            raise ConflictError(
                f"attempt {attempt_id} was already reported {status} with reward {first}: this report's reward"
                f" {reward} disagrees, it is refused and the first report stands"
            )
        return _rollout(conn, ro["id"]), []  # a repeated report: already recorded
    if reported:
        raise ConflictError(
            f"attempt {attempt_id} was already reported {att['status']}: this report ({status}) disagrees, it is"
            " refused and the first report stands"
        )
    is_latest = latest_attempt_id(conn, ro["id"]) == attempt_id
    if att["status"] != _RUNNING:
        # A late report from an attempt whose lease expired: accept it only while nobody else has
        # picked the rollout up again, so a rollout is never recorded twice.
        if not (is_latest and ro["status"] == _QUEUED):
            raise ConflictError(
                f"attempt {attempt_id} was already marked {att['status']} and rollout {ro['id']} is"
                f" {ro['status']}; this report is discarded"
            )
    elif not is_latest or ro["status"] != _RUNNING:
        raise ConflictError(f"attempt {attempt_id} is not the active attempt of rollout {ro['id']}")
    conn.execute("UPDATE attempts SET status=?, ended_at=?, error=? WHERE id=?", (status, now, error, attempt_id))
    if elsewhere is not None:  # (bypassed, the first one's URL, external, answered, refused) as the runner counted
        conn.execute(
            "UPDATE attempts SET bypassed_llm_calls=?, bypassed_llm_url=?, external_llm_calls=?,"
            " bypassed_llm_answered=?, bypassed_llm_refused=? WHERE id=?",
            (*elsewhere, attempt_id),
        )
        conn.execute("UPDATE rollouts SET bypassed_llm_calls=? WHERE id=?", (elsewhere[0], ro["id"]))
    place_unplaced(conn, ro["id"], attempt_id)  # rewards that arrived before the calls they followed were stored
    if reward is not None:
        insert_reward(
            conn,
            placed(
                conn,
                RewardIn(
                    rollout_id=ro["id"],
                    attempt_id=attempt_id,
                    value=reward,
                    name=COMPLETION_REWARD,
                    source=RewardSource.returned,
                    after_llm_seq=after_llm_seq,
                    timestamp=now,
                ),
            ),
        )
    if status == AttemptStatus.succeeded.value:
        final = reward
        if final is None:
            last = conn.execute(
                "SELECT value FROM rewards WHERE attempt_id=? ORDER BY timestamp DESC, id DESC LIMIT 1",
                (attempt_id,),
            ).fetchone()
            final = None if last is None else last["value"]
        conn.execute(
            "UPDATE rollouts SET status=?, ended_at=?, final_attempt_id=?, final_reward=?, error=NULL WHERE id=?",
            (RolloutStatus.succeeded.value, now, attempt_id, final, ro["id"]),
        )
        pack(conn, attempt_id, ro["id"])
    elif ro["status"] == _RUNNING:
        # the rollout keeps the message; the traceback stays with the attempt (agl show prints it there)
        message = failure.split(error)[0] if error else "no detail"
        retry_or_fail(conn, ro, f"attempt {att['number']} {status}: {message}", now)
    return _rollout(conn, ro["id"]), [attempt_id]


def _ended_by_server(att: sqlite3.Row) -> bool:
    """Whether an ended attempt was ended by the server (its lease or its timeout ran out, its rollout was
    cancelled) rather than by a report of its own: a report may still come late for the first."""
    error = att["error"] or ""
    return (
        att["status"] == AttemptStatus.lost.value
        or (att["status"] == AttemptStatus.timeout.value and error.startswith(_TIMED_OUT))
        or error == _CANCELLED
    )


def _completion_reward(conn: sqlite3.Connection, rollout_id: str, attempt_id: str) -> float | None:
    """The reward an attempt's completion reported (its stored `returned` reward), or None if it reported none."""
    row = conn.execute(
        "SELECT value FROM rewards WHERE rollout_id=? AND attempt_id=? AND source=? AND name=? ORDER BY id DESC LIMIT 1",
        (rollout_id, attempt_id, RewardSource.returned.value, COMPLETION_REWARD),
    ).fetchone()
    return None if row is None else float(row["value"])


def expire_leases(conn: sqlite3.Connection, grace_s: float, now: float) -> list[str]:
    """End the running attempts whose lease, or whose rollout's timeout (+ `grace_s`), ran out, and retry or
    fail their rollouts. Returns the attempts it ended."""
    expired = conn.execute(
        "SELECT a.id AS attempt_id, a.number, a.lease_expires_at, a.started_at, r.timeout_s"
        " FROM attempts a JOIN rollouts r ON r.id = a.rollout_id WHERE a.status=?"
        " AND (a.lease_expires_at < ? OR (r.timeout_s IS NOT NULL AND a.started_at + r.timeout_s + ? < ?))",
        (_RUNNING, now, grace_s, now),
    ).fetchall()
    for row in expired:
        timed_out = row["timeout_s"] is not None and row["started_at"] + row["timeout_s"] + grace_s < now
        status, reason = (
            (AttemptStatus.timeout, f"{_TIMED_OUT} {row['timeout_s']} s")
            if timed_out
            else (AttemptStatus.lost, "lease expired: the worker stopped sending heartbeats")
        )
        conn.execute(
            "UPDATE attempts SET status=?, ended_at=?, error=? WHERE id=?",
            (status.value, now, reason, row["attempt_id"]),
        )
        ro = conn.execute(
            "SELECT r.id, r.status, r.attempt_count, r.max_attempts FROM rollouts r"
            " JOIN attempts a ON a.rollout_id = r.id WHERE a.id=?",
            (row["attempt_id"],),
        ).fetchone()
        if ro["status"] == _RUNNING and latest_attempt_id(conn, ro["id"]) == row["attempt_id"]:
            retry_or_fail(conn, ro, f"attempt {row['number']} {reason}", now)
    return [row["attempt_id"] for row in expired]


def cancel(conn: sqlite3.Connection, rollout_id: str, now: float) -> tuple[Rollout, list[str]]:
    """Cancel a rollout that has not ended, failing its running attempt. Returns the rollout and the attempts
    this ended."""
    ro = conn.execute("SELECT status FROM rollouts WHERE id=?", (rollout_id,)).fetchone()
    if ro is None:
        raise NotFoundError(f"rollout {rollout_id!r} does not exist")
    if RolloutStatus(ro["status"]).terminal:
        return _rollout(conn, rollout_id), []
    running = [
        r[0] for r in conn.execute("SELECT id FROM attempts WHERE rollout_id=? AND status=?", (rollout_id, _RUNNING))
    ]
    conn.execute(
        "UPDATE attempts SET status=?, ended_at=?, error=? WHERE rollout_id=? AND status=?",
        (AttemptStatus.failed.value, now, _CANCELLED, rollout_id, _RUNNING),
    )
    conn.execute(
        "UPDATE rollouts SET status=?, ended_at=? WHERE id=?", (RolloutStatus.cancelled.value, now, rollout_id)
    )
    return _rollout(conn, rollout_id), running


def may_report(conn: sqlite3.Connection, attempt: sqlite3.Row) -> bool:
    """An attempt may report while it runs, and, once its lease expired, while nobody else has picked its
    rollout up again (the rule `complete` applies to late reports). `attempt`: its id, rollout_id and status."""
    if attempt["status"] == _RUNNING:
        return True
    if attempt["status"] != AttemptStatus.lost.value:
        return False
    ro = conn.execute("SELECT status FROM rollouts WHERE id=?", (attempt["rollout_id"],)).fetchone()
    return (
        ro is not None and ro["status"] == _QUEUED and latest_attempt_id(conn, attempt["rollout_id"]) == attempt["id"]
    )


def check_span_owners(
    conn: sqlite3.Connection, owners: Mapping[tuple[str | None, str], Sequence[tuple[str, str]]]
) -> None:
    """Spans an agent reports: each attempt named must belong to the rollout named and still be able to report
    (`may_report`). `owners`: (rollout id, attempt id) → the (trace id, span id) of its spans in the batch. Spans
    stored already (a batch sent again after its answer was lost) pass whatever the attempt's state."""
    for (rollout_id, attempt_id), keys in owners.items():
        att = conn.execute("SELECT id, rollout_id, status FROM attempts WHERE id=?", (attempt_id,)).fetchone()
        if att is None or att["rollout_id"] != rollout_id:
            raise NotFoundError(f"spans name attempt {attempt_id!r} of rollout {rollout_id!r}, which does not exist")
        if may_report(conn, att):
            continue
        stored = sum(
            conn.execute("SELECT 1 FROM spans WHERE trace_id=? AND span_id=?", key).fetchone() is not None
            for key in keys
        )
        if stored < len(keys):
            raise ConflictError(f"attempt {attempt_id} is {att['status']}: it can no longer report spans")


def add_rewards(conn: sqlite3.Connection, rewards: Sequence[RewardIn]) -> int:
    """Store rewards; all or none (the caller's savepoint undoes a partial batch). The agent's own rewards
    (explicit, returned) are accepted only while its attempt may still report; rewards computed afterwards from
    the trace (automatic, AIR) at any time."""
    succeeded: set[str] = set()  # attempts that may have a pack to write again (agl.store.attempt_packs)
    for r in rewards:
        att = conn.execute("SELECT id, rollout_id, status FROM attempts WHERE id=?", (r.attempt_id,)).fetchone()
        if att is None or att["rollout_id"] != r.rollout_id:
            raise NotFoundError(f"attempt {r.attempt_id!r} of rollout {r.rollout_id!r} does not exist")
        if r.source is not RewardSource.automatic and not may_report(conn, att):
            if r.uid is not None and conn.execute("SELECT 1 FROM rewards WHERE uid=?", (r.uid,)).fetchone():
                continue  # a re-sent reward that was stored before the attempt ended
            raise ConflictError(f"attempt {r.attempt_id} is {att['status']}: it can no longer report rewards")
        insert_reward(conn, placed(conn, r))
        if att["status"] == AttemptStatus.succeeded.value:
            succeeded.add(r.attempt_id)
    for attempt_id in succeeded:  # rewards computed after the attempt succeeded (AIR)
        repack_if_packed(conn, attempt_id)
    return len(rewards)
