"""The durable store: one SQLite file (WAL) per run directory.

Writes go through a single writer thread that commits whatever has queued up in one transaction (group
commit): many concurrent requests cost one fsync-free WAL commit, and a caller's future resolves only after
its write is committed, so anything acknowledged survives a crash of the server process. Each write runs
inside its own SAVEPOINT, so one bad write fails alone and never rolls back its neighbours. Reads use
per-thread connections, which WAL lets run beside the writer.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import orjson

from agl.schema import (
    Attempt,
    AttemptStatus,
    Attribution,
    Claim,
    EnqueueRequest,
    LLMCall,
    ModelVersion,
    ModelVersionIn,
    Reward,
    RewardIn,
    RewardSource,
    Rollout,
    RolloutDetail,
    RolloutStatus,
    Span,
    SpanIn,
    Task,
    TaskIn,
)
from agl.store.errors import ConflictError, NotFoundError

log = logging.getLogger(__name__)
T = TypeVar("T")

DB_FILENAME = "agl.sqlite"
SCHEMA_VERSION = 3
# How to bring a store written by an older agl up to date, step by step; applied once, in one transaction, when
# the store is opened (data already stored is kept).
MIGRATIONS: dict[int, str] = {
    # 1 → 2: per-agent policies (model versions name the backend model each agent's calls go to)
    1: "ALTER TABLE model_versions ADD COLUMN agent_models TEXT",
    # 2 → 3: the sampling temperature of each LLM call (the trainer computes log-probs at that temperature)
    2: "ALTER TABLE llm_calls ADD COLUMN temperature REAL",
}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tasks (
  id TEXT PRIMARY KEY, input TEXT NOT NULL, metadata TEXT NOT NULL, created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS rollouts (
  id TEXT PRIMARY KEY, task_id TEXT NOT NULL REFERENCES tasks(id), mode TEXT NOT NULL, step INTEGER,
  status TEXT NOT NULL, attempt_count INTEGER NOT NULL, max_attempts INTEGER NOT NULL, timeout_s REAL,
  created_at REAL NOT NULL, started_at REAL, ended_at REAL, final_attempt_id TEXT, final_reward REAL,
  error TEXT, metadata TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS rollouts_status ON rollouts(status, created_at);
CREATE INDEX IF NOT EXISTS rollouts_task ON rollouts(task_id);
CREATE TABLE IF NOT EXISTS attempts (
  id TEXT PRIMARY KEY, rollout_id TEXT NOT NULL REFERENCES rollouts(id), number INTEGER NOT NULL,
  worker_id TEXT NOT NULL, status TEXT NOT NULL, started_at REAL NOT NULL, heartbeat_at REAL NOT NULL,
  lease_expires_at REAL NOT NULL, ended_at REAL, error TEXT);
CREATE INDEX IF NOT EXISTS attempts_rollout ON attempts(rollout_id);
CREATE INDEX IF NOT EXISTS attempts_lease ON attempts(status, lease_expires_at);
CREATE TABLE IF NOT EXISTS spans (
  trace_id TEXT NOT NULL, span_id TEXT NOT NULL, parent_id TEXT, name TEXT NOT NULL, kind TEXT NOT NULL,
  start_time REAL NOT NULL, end_time REAL NOT NULL, attributes TEXT NOT NULL, status TEXT NOT NULL,
  status_message TEXT, events TEXT NOT NULL, rollout_id TEXT, attempt_id TEXT, agent_name TEXT,
  source TEXT NOT NULL, PRIMARY KEY (trace_id, span_id));
CREATE INDEX IF NOT EXISTS spans_rollout ON spans(rollout_id);
CREATE TABLE IF NOT EXISTS llm_calls (
  id TEXT PRIMARY KEY, rollout_id TEXT NOT NULL, attempt_id TEXT NOT NULL, seq INTEGER NOT NULL,
  agent_name TEXT, attribution TEXT NOT NULL, trace_id TEXT, parent_span_id TEXT, model_requested TEXT,
  model TEXT, model_version INTEGER, request TEXT NOT NULL, response_message TEXT, prompt_ids TEXT,
  response_ids TEXT, logprobs TEXT, finish_reason TEXT, stream INTEGER NOT NULL, status TEXT NOT NULL,
  http_status INTEGER NOT NULL, error TEXT, started_at REAL NOT NULL, latency_s REAL NOT NULL,
  usage TEXT NOT NULL, trainable INTEGER NOT NULL, not_trainable_reason TEXT, temperature REAL,
  UNIQUE (attempt_id, seq));
CREATE INDEX IF NOT EXISTS llm_calls_rollout ON llm_calls(rollout_id, attempt_id, seq);
CREATE TABLE IF NOT EXISTS rewards (
  id INTEGER PRIMARY KEY AUTOINCREMENT, rollout_id TEXT NOT NULL, attempt_id TEXT NOT NULL,
  value REAL NOT NULL, name TEXT NOT NULL, source TEXT NOT NULL, after_llm_seq INTEGER, span_id TEXT,
  agent_name TEXT, timestamp REAL NOT NULL, metadata TEXT NOT NULL, uid TEXT UNIQUE);
CREATE INDEX IF NOT EXISTS rewards_rollout ON rewards(rollout_id);
CREATE TABLE IF NOT EXISTS model_versions (
  version INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, upstream_model TEXT,
  metadata TEXT NOT NULL, created_at REAL NOT NULL, agent_models TEXT);
"""


class _IdSource:
    """64 random bits per id from a generator seeded by the OS once per process (re-seeded after a fork):
    ids must not collide across millions of LLM calls, and asking the OS for every id showed up in the
    proxy's profile."""

    def __init__(self) -> None:
        self._pid = -1
        self._rng = random.Random()

    def bits(self) -> int:
        if self._pid != os.getpid():
            self._rng = random.Random(os.urandom(32))
            self._pid = os.getpid()
        return self._rng.getrandbits(64)


_ID_SOURCE = _IdSource()


def new_id(prefix: str) -> str:
    return f"{prefix}-{_ID_SOURCE.bits():016x}"


# Named columns: a column added by a migration lands last in an old store but may sit elsewhere in a new one.
_LLM_CALL_COLUMNS = (
    "id, rollout_id, attempt_id, seq, agent_name, attribution, trace_id, parent_span_id, model_requested, model,"
    " model_version, request, response_message, prompt_ids, response_ids, logprobs, finish_reason, stream, status,"
    " http_status, error, started_at, latency_s, usage, trainable, not_trainable_reason, temperature"
)
_INSERT_LLM_CALL = f"INSERT INTO llm_calls ({_LLM_CALL_COLUMNS}) VALUES ({','.join('?' * 27)})"


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def _loads(text: str | None) -> Any:
    return None if text is None else orjson.loads(text)


_STOP = object()


class Store:
    """Durable store of one run. Thread-safe; writes return futures that resolve once committed."""

    def __init__(self, path: str | Path, *, max_batch: int = 1024) -> None:
        path = Path(path)
        if path.is_dir() or path.suffix == "":
            path.mkdir(parents=True, exist_ok=True)
            path = path / DB_FILENAME
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._max_batch = max_batch
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._local = threading.local()
        self._seq_lock = threading.Lock()
        self._next_seq: dict[str, itertools.count[int]] = {}
        self._attempt_rollout: dict[str, tuple[str, str]] = {}  # attempt id → (rollout id, mode)
        self._write_conn = self._connect()
        self._write_conn.executescript(_SCHEMA)
        self._check_schema_version()
        self._closed = False
        self._writer = threading.Thread(target=self._write_loop, name="agl-store-writer", daemon=True)
        self._writer.start()

    # ------------------------------------------------------------------------------------ plumbing

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")
        # NORMAL keeps every commit durable against a crash of this process (the WAL is written before the
        # commit returns); only an OS crash or power loss can drop the last commits.
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.row_factory = sqlite3.Row
        return conn

    def _check_schema_version(self) -> None:
        row = self._write_conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None:
            self._write_conn.execute(
                "INSERT INTO meta(key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
            )
            return
        found = int(row["value"])
        if found > SCHEMA_VERSION:
            raise RuntimeError(
                f"{self.path} has store schema version {found}, newer than this agl's {SCHEMA_VERSION}: upgrade agl"
            )
        if found < SCHEMA_VERSION:
            conn = self._write_conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                for version in range(found, SCHEMA_VERSION):
                    conn.execute(MIGRATIONS[version])
                conn.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),))
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def _reader(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
        return conn

    def submit(self, fn: Callable[[sqlite3.Connection], T], *, single_statement: bool = False) -> Future[T]:
        """Queue a write; the future resolves after the transaction holding it commits.

        Each write runs in a savepoint, so one that fails leaves the others of its batch intact. A write of
        one SQL statement (`single_statement`) needs none: SQLite undoes a failed statement by itself, and the
        savepoint's three extra statements were a third of the writer's time on the proxy's inserts."""
        if self._closed:
            raise RuntimeError("store is closed")
        fut: Future[T] = Future()
        self._queue.put((fn, fut, single_statement))
        return fut

    def _write_loop(self) -> None:
        conn = self._write_conn
        while True:
            first = self._queue.get()
            if first is _STOP:
                return
            batch = [first]
            stop = False
            while len(batch) < self._max_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    stop = True
                    break
                batch.append(item)
            self._run_batch(conn, batch)
            if stop:
                return

    def _run_batch(self, conn: sqlite3.Connection, batch: list[tuple[Callable[..., Any], Future[Any], bool]]) -> None:
        outcomes: list[tuple[Future[Any], Any, BaseException | None]] = []
        try:
            conn.execute("BEGIN IMMEDIATE")
            for fn, fut, single_statement in batch:
                if single_statement:
                    try:
                        outcomes.append((fut, fn(conn), None))
                    except Exception as exc:  # SQLite undid the statement; the transaction goes on
                        outcomes.append((fut, None, exc))
                    continue
                conn.execute("SAVEPOINT op")
                try:
                    result = fn(conn)
                except BaseException as exc:
                    conn.execute("ROLLBACK TO op")
                    conn.execute("RELEASE op")
                    outcomes.append((fut, None, exc))
                else:
                    conn.execute("RELEASE op")
                    outcomes.append((fut, result, None))
            conn.execute("COMMIT")
        except BaseException as exc:
            log.exception("store commit failed")
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            for _, fut, _ in batch:
                if not fut.done():
                    fut.set_exception(exc)
            return
        for fut, result, err in outcomes:
            if err is not None:
                fut.set_exception(err)
            else:
                fut.set_result(result)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._writer.join()
        self._write_conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --------------------------------------------------------------------------------- row mapping

    @staticmethod
    def _task(row: sqlite3.Row) -> Task:
        return Task(
            id=row["id"], input=_loads(row["input"]), metadata=_loads(row["metadata"]), created_at=row["created_at"]
        )

    @staticmethod
    def _rollout(row: sqlite3.Row) -> Rollout:
        d = dict(row)
        d["metadata"] = _loads(d["metadata"])
        return Rollout.model_validate(d)

    @staticmethod
    def _attempt(row: sqlite3.Row) -> Attempt:
        return Attempt.model_validate(dict(row))

    @staticmethod
    def _span(row: sqlite3.Row) -> Span:
        d = dict(row)
        d["attributes"] = _loads(d["attributes"])
        d["events"] = _loads(d["events"])
        return Span.model_validate(d)

    @staticmethod
    def _llm_call(row: sqlite3.Row) -> LLMCall:
        d = dict(row)
        for key in ("request", "response_message", "prompt_ids", "response_ids", "logprobs", "usage"):
            d[key] = _loads(d[key])
        d["stream"] = bool(d["stream"])
        d["trainable"] = bool(d["trainable"])
        return LLMCall.model_validate(d)

    @staticmethod
    def _llm_call_trusted(row: sqlite3.Row) -> LLMCall:
        """`_llm_call` without validation, for bulk reads: these rows were validated when they were written,
        and validating long id lists again cost more than reading them."""
        d = dict(row)
        for key in ("request", "response_message", "prompt_ids", "response_ids", "logprobs", "usage"):
            d[key] = _loads(d[key])
        d["stream"] = bool(d["stream"])
        d["trainable"] = bool(d["trainable"])
        d["attribution"] = Attribution(d["attribution"])
        return LLMCall.model_construct(**d)

    @staticmethod
    def _reward(row: sqlite3.Row) -> Reward:
        d = dict(row)
        d["metadata"] = _loads(d["metadata"])
        return Reward.model_validate(d)

    # ------------------------------------------------------------------------------ tasks/rollouts

    @staticmethod
    def _insert_task(conn: sqlite3.Connection, task: TaskIn, now: float) -> Task:
        task_id = task.id or new_id("task")
        try:
            conn.execute(
                "INSERT INTO tasks(id, input, metadata, created_at) VALUES (?,?,?,?)",
                (task_id, _dumps(task.input), _dumps(task.metadata), now),
            )
        except sqlite3.IntegrityError as exc:
            existing = conn.execute("SELECT * FROM tasks WHERE id=?", (task_id,)).fetchone()
            if existing is not None and _loads(existing["input"]) == task.input:
                return Store._task(existing)  # the same task sent twice: idempotent
            raise ConflictError(f"task {task_id!r} already exists with a different input") from exc
        return Task(id=task_id, input=task.input, metadata=task.metadata, created_at=now)

    def add_task(self, task: TaskIn) -> Future[Task]:
        return self.submit(lambda conn: self._insert_task(conn, task, time.time()))

    def enqueue(self, req: EnqueueRequest) -> Future[list[Rollout]]:
        if (req.task_id is None) == (req.task is None):
            raise ValueError("give exactly one of task_id and task")

        def op(conn: sqlite3.Connection) -> list[Rollout]:
            now = time.time()
            if req.task is not None:
                task = self._insert_task(conn, req.task, now)
            else:
                row = conn.execute("SELECT * FROM tasks WHERE id=?", (req.task_id,)).fetchone()
                if row is None:
                    raise NotFoundError(f"task {req.task_id!r} does not exist")
                task = self._task(row)
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
                    "INSERT INTO rollouts(id, task_id, mode, step, status, attempt_count, max_attempts, timeout_s,"
                    " created_at, metadata) VALUES (?,?,?,?,?,?,?,?,?,?)",
                    (
                        rollout.id,
                        task.id,
                        req.mode,
                        req.step,
                        "queued",
                        0,
                        req.max_attempts,
                        req.timeout_s,
                        now,
                        _dumps(req.metadata),
                    ),
                )
                out.append(rollout)
            return out

        return self.submit(op)

    def claim(self, worker_id: str, max_rollouts: int, lease_s: float) -> Future[list[Claim]]:
        def op(conn: sqlite3.Connection) -> list[Claim]:
            now = time.time()
            rows = conn.execute(
                "SELECT * FROM rollouts WHERE status='queued' ORDER BY created_at, rowid LIMIT ?", (max_rollouts,)
            ).fetchall()
            claims = []
            for row in rows:
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
                conn.execute(
                    "INSERT INTO attempts(id, rollout_id, number, worker_id, status, started_at, heartbeat_at,"
                    " lease_expires_at) VALUES (?,?,?,?,?,?,?,?)",
                    (attempt.id, row["id"], number, worker_id, "running", now, now, now + lease_s),
                )
                conn.execute(
                    "UPDATE rollouts SET status='running', attempt_count=?, started_at=COALESCE(started_at, ?)"
                    " WHERE id=?",
                    (number, now, row["id"]),
                )
                rollout = self._rollout(conn.execute("SELECT * FROM rollouts WHERE id=?", (row["id"],)).fetchone())
                task = self._task(conn.execute("SELECT * FROM tasks WHERE id=?", (row["task_id"],)).fetchone())
                self._attempt_rollout[attempt.id] = (rollout.id, rollout.mode)
                claims.append(Claim(rollout=rollout, attempt=attempt, task=task))
            return claims

        return self.submit(op)

    @staticmethod
    def _latest_attempt_id(conn: sqlite3.Connection, rollout_id: str) -> str | None:
        row = conn.execute(
            "SELECT id FROM attempts WHERE rollout_id=? ORDER BY number DESC LIMIT 1", (rollout_id,)
        ).fetchone()
        return None if row is None else str(row["id"])

    def heartbeat(self, attempt_id: str, lease_s: float) -> Future[Attempt]:
        def op(conn: sqlite3.Connection) -> Attempt:
            row = conn.execute("SELECT * FROM attempts WHERE id=?", (attempt_id,)).fetchone()
            if row is None:
                raise NotFoundError(f"attempt {attempt_id!r} does not exist")
            if row["status"] != "running":
                raise ConflictError(f"attempt {attempt_id} is {row['status']}, not running: stop working on it")
            now = time.time()
            conn.execute(
                "UPDATE attempts SET heartbeat_at=?, lease_expires_at=? WHERE id=?", (now, now + lease_s, attempt_id)
            )
            return self._attempt(conn.execute("SELECT * FROM attempts WHERE id=?", (attempt_id,)).fetchone())

        return self.submit(op)

    def _retry_or_fail(self, conn: sqlite3.Connection, rollout: sqlite3.Row, reason: str, now: float) -> None:
        if rollout["attempt_count"] < rollout["max_attempts"]:
            conn.execute("UPDATE rollouts SET status='queued', error=? WHERE id=?", (reason, rollout["id"]))
        else:
            conn.execute(
                "UPDATE rollouts SET status='failed', ended_at=?, error=? WHERE id=?",
                (now, f"{reason} (attempt {rollout['attempt_count']} of {rollout['max_attempts']})", rollout["id"]),
            )

    def complete(
        self,
        attempt_id: str,
        status: str,
        *,
        reward: float | None = None,
        error: str | None = None,
        after_llm_seq: int | None = None,
        agent_scopes: int | None = None,
    ) -> Future[Rollout]:
        """Report an attempt's outcome once; a repeated identical report is a no-op (idempotent).

        `agent_scopes`: how many agent scopes the attempt opened; with any, its calls that came through an HTTP
        client agl does not patch are marked `missed` (their agent name was lost, see `missed_attribution`)."""

        def op(conn: sqlite3.Connection) -> Rollout:
            now = time.time()
            att = conn.execute("SELECT * FROM attempts WHERE id=?", (attempt_id,)).fetchone()
            if att is None:
                raise NotFoundError(f"attempt {attempt_id!r} does not exist")
            ro = conn.execute("SELECT * FROM rollouts WHERE id=?", (att["rollout_id"],)).fetchone()
            if agent_scopes:
                conn.execute(
                    "UPDATE llm_calls SET attribution=? WHERE attempt_id=? AND attribution=?",
                    (Attribution.missed.value, attempt_id, Attribution.unhooked.value),
                )
            if att["status"] == status:
                return self._rollout(ro)  # a repeated report: already recorded
            is_latest = self._latest_attempt_id(conn, ro["id"]) == attempt_id
            if att["status"] != "running":
                # A late report from an attempt whose lease expired: accept it only while nobody else has
                # picked the rollout up again, so a rollout is never recorded twice.
                if not (is_latest and ro["status"] == "queued"):
                    raise ConflictError(
                        f"attempt {attempt_id} was already marked {att['status']} and rollout {ro['id']} is"
                        f" {ro['status']}; this report is discarded"
                    )
            elif not is_latest or ro["status"] != "running":
                raise ConflictError(f"attempt {attempt_id} is not the active attempt of rollout {ro['id']}")
            conn.execute(
                "UPDATE attempts SET status=?, ended_at=?, error=? WHERE id=?", (status, now, error, attempt_id)
            )
            self._ended([attempt_id])
            if reward is not None:
                self._insert_reward(
                    conn,
                    RewardIn(
                        rollout_id=ro["id"],
                        attempt_id=attempt_id,
                        value=reward,
                        name="final",
                        source=RewardSource.returned,
                        after_llm_seq=after_llm_seq,
                        timestamp=now,
                    ),
                )
            if status == "succeeded":
                final = reward
                if final is None:
                    last = conn.execute(
                        "SELECT value FROM rewards WHERE attempt_id=? ORDER BY timestamp DESC, id DESC LIMIT 1",
                        (attempt_id,),
                    ).fetchone()
                    final = None if last is None else last["value"]
                conn.execute(
                    "UPDATE rollouts SET status='succeeded', ended_at=?, final_attempt_id=?, final_reward=?,"
                    " error=NULL WHERE id=?",
                    (now, attempt_id, final, ro["id"]),
                )
            elif ro["status"] == "running":
                self._retry_or_fail(conn, ro, f"attempt {att['number']} {status}: {error or 'no detail'}", now)
            return self._rollout(conn.execute("SELECT * FROM rollouts WHERE id=?", (ro["id"],)).fetchone())

        return self.submit(op)

    def expire_leases(self, grace_s: float = 5.0) -> Future[int]:
        """Mark attempts whose lease or timeout ran out, and retry or fail their rollouts."""

        def op(conn: sqlite3.Connection) -> int:
            now = time.time()
            rows = conn.execute(
                "SELECT a.id AS attempt_id, a.number, a.lease_expires_at, a.started_at, r.timeout_s"
                " FROM attempts a JOIN rollouts r ON r.id = a.rollout_id WHERE a.status='running'"
                " AND (a.lease_expires_at < ? OR (r.timeout_s IS NOT NULL AND a.started_at + r.timeout_s + ? < ?))",
                (now, grace_s, now),
            ).fetchall()
            for row in rows:
                timed_out = row["timeout_s"] is not None and row["started_at"] + row["timeout_s"] + grace_s < now
                status, reason = (
                    ("timeout", f"ran past its timeout of {row['timeout_s']} s")
                    if timed_out
                    else ("lost", "lease expired: the worker stopped sending heartbeats")
                )
                conn.execute(
                    "UPDATE attempts SET status=?, ended_at=?, error=? WHERE id=?",
                    (status, now, reason, row["attempt_id"]),
                )
                self._ended([row["attempt_id"]])
                ro = conn.execute(
                    "SELECT r.* FROM rollouts r JOIN attempts a ON a.rollout_id=r.id WHERE a.id=?",
                    (row["attempt_id"],),
                ).fetchone()
                if ro["status"] == "running" and self._latest_attempt_id(conn, ro["id"]) == row["attempt_id"]:
                    self._retry_or_fail(conn, ro, f"attempt {row['number']} {reason}", now)
            return len(rows)

        return self.submit(op)

    def cancel(self, rollout_id: str) -> Future[Rollout]:
        def op(conn: sqlite3.Connection) -> Rollout:
            ro = conn.execute("SELECT * FROM rollouts WHERE id=?", (rollout_id,)).fetchone()
            if ro is None:
                raise NotFoundError(f"rollout {rollout_id!r} does not exist")
            if RolloutStatus(ro["status"]).terminal:
                return self._rollout(ro)
            now = time.time()
            running = [
                r[0]
                for r in conn.execute("SELECT id FROM attempts WHERE rollout_id=? AND status='running'", (rollout_id,))
            ]
            conn.execute(
                "UPDATE attempts SET status='failed', ended_at=?, error='rollout cancelled'"
                " WHERE rollout_id=? AND status='running'",
                (now, rollout_id),
            )
            self._ended(running)
            conn.execute("UPDATE rollouts SET status='cancelled', ended_at=? WHERE id=?", (now, rollout_id))
            return self._rollout(conn.execute("SELECT * FROM rollouts WHERE id=?", (rollout_id,)).fetchone())

        return self.submit(op)

    # ------------------------------------------------------------------------- spans/calls/rewards

    def add_spans(self, spans: Sequence[SpanIn]) -> Future[int]:
        rows = [
            (
                s.trace_id,
                s.span_id,
                s.parent_id,
                s.name,
                s.kind,
                s.start_time,
                s.end_time,
                _dumps(s.attributes),
                s.status.value,
                s.status_message,
                _dumps(s.events),
                s.rollout_id,
                s.attempt_id,
                s.agent_name,
                s.source,
            )
            for s in spans
        ]

        def op(conn: sqlite3.Connection) -> int:
            # OTLP exporters re-send on timeouts: the (trace_id, span_id) key makes a re-sent span a no-op.
            cur = conn.executemany("INSERT OR IGNORE INTO spans VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", rows)
            return cur.rowcount

        return self.submit(op)

    @staticmethod
    def _insert_reward(conn: sqlite3.Connection, r: RewardIn) -> None:
        conn.execute(
            "INSERT OR IGNORE INTO rewards(rollout_id, attempt_id, value, name, source, after_llm_seq, span_id,"
            " agent_name, timestamp, metadata, uid) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (
                r.rollout_id,
                r.attempt_id,
                r.value,
                r.name,
                r.source.value,
                r.after_llm_seq,
                r.span_id,
                r.agent_name,
                r.timestamp if r.timestamp is not None else time.time(),
                _dumps(r.metadata),
                r.uid,
            ),
        )

    def add_rewards(self, rewards: Sequence[RewardIn]) -> Future[int]:
        """Store rewards; all or none. The agent's own rewards (explicit, returned) are accepted only while its
        attempt may still report; rewards computed afterwards from the trace (automatic, AIR) at any time."""

        def op(conn: sqlite3.Connection) -> int:
            for r in rewards:
                att = conn.execute("SELECT * FROM attempts WHERE id=?", (r.attempt_id,)).fetchone()
                if att is None or att["rollout_id"] != r.rollout_id:
                    raise NotFoundError(f"attempt {r.attempt_id!r} of rollout {r.rollout_id!r} does not exist")
                if r.source is not RewardSource.automatic and not self._may_report(conn, att):
                    if r.uid is not None and conn.execute("SELECT 1 FROM rewards WHERE uid=?", (r.uid,)).fetchone():
                        continue  # a re-sent reward that was stored before the attempt ended
                    raise ConflictError(f"attempt {r.attempt_id} is {att['status']}: it can no longer report rewards")
                self._insert_reward(conn, r)
            return len(rewards)

        return self.submit(op)

    def _may_report(self, conn: sqlite3.Connection, att: sqlite3.Row) -> bool:
        """An attempt may report while it runs, and, once its lease expired, while nobody else has picked its
        rollout up again (the rule `complete` applies to late reports)."""
        if att["status"] == AttemptStatus.running.value:
            return True
        if att["status"] != AttemptStatus.lost.value:
            return False
        ro = conn.execute("SELECT status FROM rollouts WHERE id=?", (att["rollout_id"],)).fetchone()
        return (
            ro is not None
            and ro["status"] == RolloutStatus.queued.value
            and self._latest_attempt_id(conn, att["rollout_id"]) == att["id"]
        )

    def unknown_rollouts(self, ids: Iterable[str | None]) -> set[str]:
        """Which of these rollout ids do not exist (None is not an id: spans may belong to no rollout)."""
        wanted = sorted({i for i in ids if i is not None})
        found: set[str] = set()
        conn = self._reader()
        for start in range(0, len(wanted), 500):
            chunk = wanted[start : start + 500]
            marks = ",".join("?" * len(chunk))
            found.update(r[0] for r in conn.execute(f"SELECT id FROM rollouts WHERE id IN ({marks})", chunk))
        return set(wanted) - found

    def next_llm_seq(self, attempt_id: str) -> int:
        """The next sequence number of an LLM call in an attempt, in arrival order (survives restarts)."""
        with self._seq_lock:
            counter = self._next_seq.get(attempt_id)
            if counter is None:
                row = (
                    self._reader()
                    .execute("SELECT MAX(seq) AS m FROM llm_calls WHERE attempt_id=?", (attempt_id,))
                    .fetchone()
                )
                counter = itertools.count(0 if row["m"] is None else row["m"] + 1)
                self._next_seq[attempt_id] = counter
            return next(counter)

    def missed_attribution(self, attempt_id: str) -> int:
        """How many LLM calls of the attempt lost their agent name (came through a client agl does not patch)."""
        row = (
            self._reader()
            .execute(
                "SELECT count(*) FROM llm_calls WHERE attempt_id=? AND attribution=?",
                (attempt_id, Attribution.missed.value),
            )
            .fetchone()
        )
        return int(row[0])

    def attempt_rollout(self, attempt_id: str) -> tuple[str, str, bool] | None:
        """(rollout id, mode, running) of an attempt. Running attempts are cached (the proxy asks on every call);
        an attempt leaves the cache when it ends, so the cache holds only what is running now."""
        cached = self._attempt_rollout.get(attempt_id)
        if cached is not None:
            return (*cached, True)
        row = (
            self._reader()
            .execute(
                "SELECT a.rollout_id, a.status, r.mode FROM attempts a JOIN rollouts r ON r.id = a.rollout_id"
                " WHERE a.id=?",
                (attempt_id,),
            )
            .fetchone()
        )
        if row is None:
            return None
        found = (str(row["rollout_id"]), str(row["mode"]))
        running = row["status"] == AttemptStatus.running.value
        if running:
            self._attempt_rollout[attempt_id] = found
        return (*found, running)

    def _ended(self, attempt_ids: Iterable[str]) -> None:
        """Forget what is kept per running attempt (called by the writer when attempts end)."""
        with self._seq_lock:
            for attempt_id in attempt_ids:
                self._attempt_rollout.pop(attempt_id, None)
                self._next_seq.pop(attempt_id, None)

    def add_llm_call(self, call: LLMCall) -> Future[None]:
        values = (
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
            _dumps(call.request),
            _dumps(call.response_message) if call.response_message is not None else None,
            _dumps(call.prompt_ids) if call.prompt_ids is not None else None,
            _dumps(call.response_ids) if call.response_ids is not None else None,
            _dumps(call.logprobs) if call.logprobs is not None else None,
            call.finish_reason,
            int(call.stream),
            call.status,
            call.http_status,
            call.error,
            call.started_at,
            call.latency_s,
            _dumps(call.usage),
            int(call.trainable),
            call.not_trainable_reason,
            call.temperature,
        )

        def op(conn: sqlite3.Connection) -> None:
            row = conn.execute("SELECT status FROM attempts WHERE id=?", (call.attempt_id,)).fetchone()
            if row is not None and row["status"] != AttemptStatus.running.value and call.trainable:
                # it was under way when its attempt ended (the agent gave up, a lease expired): kept, not trained
                conn.execute(
                    _INSERT_LLM_CALL,
                    (*values[:24], 0, f"its attempt had ended ({row['status']}) before the call finished", values[26]),
                )
                return
            conn.execute(_INSERT_LLM_CALL, values)

        return self.submit(op, single_statement=True)

    # ----------------------------------------------------------------------------- model versions

    def publish_model_version(self, mv: ModelVersionIn) -> Future[ModelVersion]:
        def op(conn: sqlite3.Connection) -> ModelVersion:
            now = time.time()
            cur = conn.execute(
                "INSERT INTO model_versions(name, upstream_model, metadata, created_at, agent_models) VALUES (?,?,?,?,?)",
                (mv.name, mv.upstream_model, _dumps(mv.metadata), now, _dumps(mv.agent_models)),
            )
            return ModelVersion(version=int(cur.lastrowid or 0), created_at=now, **mv.model_dump())

        return self.submit(op)

    def latest_model_version(self) -> ModelVersion | None:
        row = self._reader().execute("SELECT * FROM model_versions ORDER BY version DESC LIMIT 1").fetchone()
        if row is None:
            return None
        d = dict(row)
        d["metadata"] = _loads(d["metadata"])
        d["agent_models"] = _loads(d["agent_models"]) if d["agent_models"] else {}
        return ModelVersion.model_validate(d)

    # ------------------------------------------------------------------------------------- reads

    def get_task(self, task_id: str) -> Task:
        row = self._reader().execute("SELECT * FROM tasks WHERE id=?", (task_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"task {task_id!r} does not exist")
        return self._task(row)

    def get_rollout(self, rollout_id: str) -> Rollout:
        row = self._reader().execute("SELECT * FROM rollouts WHERE id=?", (rollout_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"rollout {rollout_id!r} does not exist")
        return self._rollout(row)

    def get_rollouts(self, ids: Sequence[str]) -> list[Rollout]:
        if not ids:
            return []
        rows = (
            self._reader()
            .execute(f"SELECT * FROM rollouts WHERE id IN ({','.join('?' * len(ids))})", tuple(ids))
            .fetchall()
        )
        return [self._rollout(r) for r in rows]

    def list_rollouts(
        self, *, status: str | None = None, step: int | None = None, limit: int = 100, offset: int = 0
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
        conn = self._reader()
        total = conn.execute(f"SELECT COUNT(*) FROM rollouts{clause}", args).fetchone()[0]
        rows = conn.execute(
            f"SELECT * FROM rollouts{clause} ORDER BY created_at, rowid LIMIT ? OFFSET ?", (*args, limit, offset)
        ).fetchall()
        return [self._rollout(r) for r in rows], int(total)

    def status_counts(self) -> dict[str, int]:
        rows = self._reader().execute("SELECT status, COUNT(*) AS n FROM rollouts GROUP BY status").fetchall()
        return {r["status"]: r["n"] for r in rows}

    def attempts(self, rollout_id: str) -> list[Attempt]:
        rows = (
            self._reader()
            .execute("SELECT * FROM attempts WHERE rollout_id=? ORDER BY number", (rollout_id,))
            .fetchall()
        )
        return [self._attempt(r) for r in rows]

    def spans(self, rollout_id: str) -> list[Span]:
        rows = (
            self._reader()
            .execute("SELECT * FROM spans WHERE rollout_id=? ORDER BY start_time", (rollout_id,))
            .fetchall()
        )
        return [self._span(r) for r in rows]

    def llm_calls(self, rollout_id: str, attempt_id: str | None = None) -> list[LLMCall]:
        if attempt_id is None:
            rows = (
                self._reader()
                .execute("SELECT * FROM llm_calls WHERE rollout_id=? ORDER BY attempt_id, seq", (rollout_id,))
                .fetchall()
            )
        else:
            rows = (
                self._reader()
                .execute(
                    "SELECT * FROM llm_calls WHERE rollout_id=? AND attempt_id=? ORDER BY seq", (rollout_id, attempt_id)
                )
                .fetchall()
            )
        return [self._llm_call(r) for r in rows]

    def rewards(self, rollout_id: str) -> list[Reward]:
        rows = (
            self._reader()
            .execute("SELECT * FROM rewards WHERE rollout_id=? ORDER BY timestamp, id", (rollout_id,))
            .fetchall()
        )
        return [self._reward(r) for r in rows]

    def rollout_detail(self, rollout_id: str) -> RolloutDetail:
        rollout = self.get_rollout(rollout_id)
        return RolloutDetail(
            rollout=rollout,
            task=self.get_task(rollout.task_id),
            attempts=self.attempts(rollout_id),
            spans=self.spans(rollout_id),
            llm_calls=self.llm_calls(rollout_id),
            rewards=self.rewards(rollout_id),
        )

    def rollout_details(self, rollout_ids: Sequence[str]) -> list[RolloutDetail]:
        """`rollout_detail` of many rollouts in a few queries (the trainer's read path); unknown ids are skipped."""
        conn = self._reader()
        out: list[RolloutDetail] = []
        for start in range(0, len(rollout_ids), 500):
            chunk = list(rollout_ids[start : start + 500])
            marks = ",".join("?" * len(chunk))

            def rows(sql: str, chunk: list[str] = chunk, marks: str = marks) -> list[sqlite3.Row]:
                return conn.execute(sql.format(marks=marks), chunk).fetchall()

            rollouts = {r["id"]: self._rollout(r) for r in rows("SELECT * FROM rollouts WHERE id IN ({marks})")}
            task_ids = sorted({r.task_id for r in rollouts.values()})
            tasks = {
                t["id"]: self._task(t)
                for t in conn.execute(
                    f"SELECT * FROM tasks WHERE id IN ({','.join('?' * len(task_ids))})", task_ids
                ).fetchall()
            }
            grouped: dict[str, dict[str, list[Any]]] = {
                rid: {"attempts": [], "spans": [], "llm_calls": [], "rewards": []} for rid in rollouts
            }
            for row in rows("SELECT * FROM attempts WHERE rollout_id IN ({marks}) ORDER BY number"):
                grouped[row["rollout_id"]]["attempts"].append(self._attempt(row))
            for row in rows("SELECT * FROM spans WHERE rollout_id IN ({marks}) ORDER BY start_time"):
                grouped[row["rollout_id"]]["spans"].append(self._span(row))
            for row in rows("SELECT * FROM llm_calls WHERE rollout_id IN ({marks}) ORDER BY attempt_id, seq"):
                grouped[row["rollout_id"]]["llm_calls"].append(self._llm_call_trusted(row))
            for row in rows("SELECT * FROM rewards WHERE rollout_id IN ({marks}) ORDER BY timestamp, id"):
                grouped[row["rollout_id"]]["rewards"].append(self._reward(row))
            for rid in chunk:
                if rid in rollouts:
                    rollout, parts = rollouts[rid], grouped[rid]
                    out.append(
                        RolloutDetail.model_construct(
                            rollout=rollout,
                            task=tasks[rollout.task_id],
                            attempts=parts["attempts"],
                            spans=parts["spans"],
                            llm_calls=parts["llm_calls"],
                            rewards=parts["rewards"],
                        )
                    )
        return out

    def iter_final_llm_calls(self, *, step: int | None = None) -> Iterator[tuple[Rollout, LLMCall]]:
        """LLM calls of the final attempt of every succeeded rollout: the calls that may become transitions."""
        args: tuple[Any, ...] = ()
        clause = ""
        if step is not None:
            clause, args = " AND r.step=?", (step,)
        rows = self._reader().execute(
            "SELECT r.id AS rid, c.* FROM rollouts r JOIN llm_calls c ON c.attempt_id = r.final_attempt_id"
            f" WHERE r.status='succeeded'{clause} ORDER BY r.created_at, r.rowid, c.seq",
            args,
        )
        cache: dict[str, Rollout] = {}
        for row in rows:
            rid = row["rid"]
            if rid not in cache:
                cache.clear()
                cache[rid] = self.get_rollout(rid)
            d = dict(row)
            d.pop("rid")
            yield cache[rid], self._llm_call(d)  # type: ignore[arg-type]

    def counts(self) -> dict[str, int]:
        conn = self._reader()
        return {
            table: int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
            for table in ("tasks", "rollouts", "attempts", "spans", "llm_calls", "rewards")
        }


__all__ = ["Store", "new_id", "DB_FILENAME", "Attribution"]
