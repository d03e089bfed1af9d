"""The durable store: one SQLite file (WAL) per run directory.

`Store` routes each write to the single writer thread (agl.store.writer: group commit, one savepoint per
write) as a function of agl.store.lifecycle or agl.store.records, and each read to a connection of the calling
thread (agl.store.reads), which WAL lets run beside the writer. It also keeps what the proxy asks about on every
call of a running attempt (its rollout, its next call number), and forgets it when the attempt ends.
"""

from __future__ import annotations

import itertools
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TypeVar

from agl.common.trainable import TrainableRollout
from agl.schema import (
    Attempt,
    Claim,
    EnqueueRequest,
    LLMCall,
    ModelVersion,
    ModelVersionIn,
    Reward,
    RewardIn,
    Rollout,
    RolloutDetail,
    Span,
    SpanIn,
    Task,
    TaskIn,
)
from agl.store import lifecycle, reads, records, rows, schema
from agl.store.schema import DB_FILENAME
from agl.store.writer import Writer

T = TypeVar("T")


class Store:
    """Durable store of one run. Thread-safe; writes return futures that resolve once committed."""

    def __init__(
        self,
        path: str | Path,
        *,
        max_batch: int = 1024,
        on_writer_death: Callable[[BaseException], None] | None = None,
    ) -> None:
        path = Path(path)
        if path.is_dir() or path.suffix == "":
            path.mkdir(parents=True, exist_ok=True)
            path = path / DB_FILENAME
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._local = threading.local()
        self._seq_lock = threading.Lock()
        self._next_seq: dict[str, itertools.count[int]] = {}
        self._attempt_rollout: dict[str, tuple[str, str]] = {}  # running attempt id → (rollout id, mode)
        conn = schema.connect(path)
        try:
            schema.migrate(conn, path)
        except BaseException:
            conn.close()
            raise
        self._writer = Writer(conn, max_batch=max_batch, on_death=on_writer_death)

    # ------------------------------------------------------------------------------------ plumbing

    def _reader(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = schema.connect(self.path)
            self._local.conn = conn
        return conn

    def submit(self, fn: Callable[[sqlite3.Connection], T], *, single_statement: bool = False) -> Future[T]:
        """Queue a write (a function of the writer's connection); see `Writer.submit`."""
        return self._writer.submit(fn, single_statement=single_statement)

    def close(self) -> None:
        self._writer.close()

    @property
    def writer(self) -> Writer:
        return self._writer

    def ping(self) -> Future[None]:
        """A write that changes nothing: it resolves once the writer has committed a transaction, so a caller
        that waits for it (with a timeout) knows the store accepts writes now."""
        return self.submit(lambda conn: None, single_statement=True)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------- per running attempt caches

    def _ended(self, attempt_ids: Iterable[str]) -> None:
        """Forget what is kept per running attempt (called by the writer when attempts end)."""
        with self._seq_lock:
            for attempt_id in attempt_ids:
                self._attempt_rollout.pop(attempt_id, None)
                self._next_seq.pop(attempt_id, None)

    def next_llm_seq(self, attempt_id: str) -> int:
        """The next sequence number of an LLM call in an attempt, in arrival order (survives restarts)."""
        with self._seq_lock:
            counter = self._next_seq.get(attempt_id)
            if counter is None:
                last = reads.max_llm_seq(self._reader(), attempt_id)
                counter = itertools.count(0 if last is None else last + 1)
                self._next_seq[attempt_id] = counter
            return next(counter)

    def attempt_rollout(self, attempt_id: str) -> tuple[str, str, bool] | None:
        """(rollout id, mode, running) of an attempt. Running attempts are cached (the proxy asks on every call);
        an attempt leaves the cache when it ends, so the cache holds only what is running now."""
        cached = self._attempt_rollout.get(attempt_id)
        if cached is not None:
            return (*cached, True)
        found = reads.attempt_state(self._reader(), attempt_id)
        if found is not None and found[2]:
            self._attempt_rollout[attempt_id] = found[:2]
        return found

    # ---------------------------------------------------------------------------------- life cycle

    def add_task(self, task: TaskIn) -> Future[Task]:
        return self.submit(lambda conn: records.insert_task(conn, task, time.time()))

    def enqueue(self, req: EnqueueRequest) -> Future[list[Rollout]]:
        if (req.task_id is None) == (req.task is None):
            raise ValueError("give exactly one of task_id and task")
        return self.submit(lambda conn: lifecycle.enqueue(conn, req, time.time()))

    def claim(self, worker_id: str, max_rollouts: int, lease_s: float) -> Future[list[Claim]]:
        def op(conn: sqlite3.Connection) -> list[Claim]:
            claims = lifecycle.claim(conn, worker_id, max_rollouts, lease_s, time.time())
            for c in claims:
                self._attempt_rollout[c.attempt.id] = (c.rollout.id, c.rollout.mode)
            return claims

        return self.submit(op)

    def heartbeat(self, attempt_id: str, lease_s: float) -> Future[Attempt]:
        return self.submit(lambda conn: lifecycle.heartbeat(conn, attempt_id, lease_s, time.time()))

    def complete(
        self,
        attempt_id: str,
        status: str,
        *,
        reward: float | None = None,
        error: str | None = None,
        after_llm_seq: int | None = None,
        agent_scopes: int | None = None,
        elsewhere: lifecycle.Elsewhere | None = None,
    ) -> Future[Rollout]:
        """Report an attempt's outcome once; a repeated identical report (same status and reward) is a no-op
        (idempotent), one that disagrees with the first raises ConflictError (the first stands).

        `agent_scopes`: how many agent scopes the attempt opened; with any, its calls that came through an HTTP
        client agl does not patch are marked `missed` (their agent name was lost, see `missed_attribution`).
        `elsewhere`: (LLM calls that bypassed agl, the first one's URL, calls to LLMs the agent named its own, of
        the bypassed ones those answered and those refused (None: not reported)), as the runner counted them; kept with the attempt, and the bypassed count with its rollout."""

        def op(conn: sqlite3.Connection) -> Rollout:
            rollout, ended = lifecycle.complete(
                conn,
                attempt_id,
                status,
                time.time(),
                reward=reward,
                error=error,
                after_llm_seq=after_llm_seq,
                agent_scopes=agent_scopes,
                elsewhere=elsewhere,
            )
            self._ended(ended)
            return rollout

        return self.submit(op)

    def expire_leases(self, grace_s: float = 5.0) -> Future[int]:
        """Mark attempts whose lease or timeout ran out, and retry or fail their rollouts."""

        def op(conn: sqlite3.Connection) -> int:
            ended = lifecycle.expire_leases(conn, grace_s, time.time())
            self._ended(ended)
            return len(ended)

        return self.submit(op)

    def cancel(self, rollout_id: str) -> Future[Rollout]:
        def op(conn: sqlite3.Connection) -> Rollout:
            rollout, ended = lifecycle.cancel(conn, rollout_id, time.time())
            self._ended(ended)
            return rollout

        return self.submit(op)

    # ------------------------------------------------------------------------- spans/calls/rewards

    def add_spans(self, spans: Sequence[SpanIn], *, reported: bool = False) -> Future[int]:
        """Store spans; how many were new. `reported`: they come from agents (the server's routes), so every
        attempt they name must be of the rollout they name and still running (`lifecycle.check_span_owners`)."""
        values = [rows.span_values(s) for s in spans]
        owners: dict[tuple[str | None, str], list[tuple[str, str]]] = {}
        if reported:
            for s in spans:
                if s.attempt_id is not None:
                    owners.setdefault((s.rollout_id, s.attempt_id), []).append((s.trace_id, s.span_id))

        def op(conn: sqlite3.Connection) -> int:
            lifecycle.check_span_owners(conn, owners)
            return records.insert_spans(conn, values)

        return self.submit(op)

    def add_rewards(self, rewards: Sequence[RewardIn]) -> Future[int]:
        """Store rewards; all or none. The agent's own rewards (explicit, returned) are accepted only while its
        attempt may still report, and placed after the attempt's last call answered before them where their own
        position is earlier (agl.store.placement); rewards computed afterwards from the trace (automatic, AIR) at any
        time."""
        return self.submit(lambda conn: lifecycle.add_rewards(conn, rewards))

    def add_llm_call(self, call: LLMCall) -> Future[None]:
        values = rows.llm_call_values(call)  # encoded here, in the caller's thread: the writer's time is scarcer
        return self.submit(lambda conn: records.insert_llm_call(conn, values), single_statement=True)

    def mark_llm_call_abandoned(self, attempt_id: str, seq: int, reason: str, http_status: int = 499) -> Future[bool]:
        """See `records.mark_llm_call_abandoned`; queued after the call's own insert, so it always finds it."""
        return self.submit(lambda conn: records.mark_llm_call_abandoned(conn, attempt_id, seq, reason, http_status))

    def publish_model_version(self, mv: ModelVersionIn) -> Future[ModelVersion]:
        return self.submit(lambda conn: records.insert_model_version(conn, mv, time.time()))

    # ------------------------------------------------------------------------------------- reads

    def unknown_rollouts(self, ids: Iterable[str | None]) -> set[str]:
        """Which of these rollout ids do not exist (None is not an id: spans may belong to no rollout)."""
        return reads.unknown_rollouts(self._reader(), ids)

    def missed_attribution(self, attempt_id: str) -> int:
        """How many LLM calls of the attempt lost their agent name (came through a client agl does not patch)."""
        return reads.missed_attribution(self._reader(), attempt_id)

    def untrainable_sampling(self, rollout_id: str, attempt_id: str) -> list[tuple[str | None, int, str]]:
        """(agent, calls, one reason) for the attempt's calls stored not trainable for how they were sampled."""
        return reads.untrainable_sampling(self._reader(), rollout_id, attempt_id)

    def latest_model_version(self) -> ModelVersion | None:
        return reads.latest_model_version(self._reader())

    def get_task(self, task_id: str) -> Task:
        return reads.get_task(self._reader(), task_id)

    def get_rollout(self, rollout_id: str) -> Rollout:
        return reads.get_rollout(self._reader(), rollout_id)

    def get_rollouts(self, ids: Sequence[str]) -> list[Rollout]:
        return reads.get_rollouts(self._reader(), ids)

    def list_rollouts(
        self, *, status: str | None = None, step: int | None = None, limit: int = 100, offset: int = 0
    ) -> tuple[list[Rollout], int]:
        return reads.list_rollouts(self._reader(), status=status, step=step, limit=limit, offset=offset)

    def status_counts(self) -> dict[str, int]:
        return reads.status_counts(self._reader())

    def attempts(self, rollout_id: str) -> list[Attempt]:
        return reads.attempts(self._reader(), rollout_id)

    def spans(self, rollout_id: str) -> list[Span]:
        return reads.spans(self._reader(), rollout_id)

    def llm_calls(self, rollout_id: str, attempt_id: str | None = None) -> list[LLMCall]:
        return reads.llm_calls(self._reader(), rollout_id, attempt_id)

    def rewards(self, rollout_id: str) -> list[Reward]:
        return reads.rewards(self._reader(), rollout_id)

    def rollout_detail(self, rollout_id: str) -> RolloutDetail:
        return reads.rollout_detail(self._reader(), rollout_id)

    def rollout_details(self, rollout_ids: Sequence[str]) -> list[RolloutDetail]:
        """`rollout_detail` of many rollouts in a few queries (the trainer's read path); unknown ids are skipped."""
        return reads.rollout_details(self._reader(), rollout_ids)

    def trainable_rollouts(self, rollout_ids: Sequence[str]) -> list[TrainableRollout]:
        """What training reads of many rollouts (their final attempts, token ids packed): agl.common.trainable."""
        return reads.trainable_rollouts(self._reader(), rollout_ids)

    def iter_final_llm_calls(self, *, step: int | None = None) -> Iterator[tuple[Rollout, LLMCall]]:
        """LLM calls of the final attempt of every succeeded rollout: the calls that may become transitions."""
        # a generator, so the reading thread's connection is the one used, as for every other read
        yield from reads.iter_final_llm_calls(self._reader(), step=step)

    def counts(self) -> dict[str, int]:
        return reads.counts(self._reader())
