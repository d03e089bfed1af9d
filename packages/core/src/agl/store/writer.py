"""The store's single writer: one thread that commits whatever has queued up in one transaction (group commit).

Many concurrent requests cost one fsync-free WAL commit, and a caller's future resolves only after its write is
committed, so anything acknowledged survives a crash of the server process. Each write runs inside its own
SAVEPOINT, so one bad write fails alone and never rolls back its neighbours.

The thread serves every client of the server, so nothing a caller does may end it: a write, once queued, runs
whether or not anyone still waits for it (its future cannot be cancelled: a caller that gives up only stops
waiting), and a failure outside any one write fails that batch alone. Should the thread end anyway, the writer
says so (`dead`), refuses new writes with the reason instead of queueing them for nobody, fails what was queued,
and tells its owner (`on_death`), which the server answers by becoming unhealthy and exiting.
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import Any, TypeVar

from agl.store.errors import StoreUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")

_STOP = object()
_Write = tuple[Callable[[sqlite3.Connection], Any], "Future[Any]", bool]


class Writer:
    """Runs writes (functions of the connection) on `conn` from one thread, up to `max_batch` per commit."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        *,
        max_batch: int = 1024,
        name: str = "agl-store-writer",
        on_death: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._conn = conn
        self._max_batch = max_batch
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = False
        self.dead: BaseException | None = None  # why the thread ended, if it ended other than by close()
        self.on_death = on_death
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[sqlite3.Connection], T], *, single_statement: bool = False) -> Future[T]:
        """Queue a write; the future resolves after the transaction holding it commits.

        Each write runs in a savepoint, so one that fails leaves the others of its batch intact. A write of
        one SQL statement (`single_statement`) needs none: SQLite undoes a failed statement by itself, and the
        savepoint's three extra statements were a third of the writer's time on the proxy's inserts."""
        if self.dead is not None:
            raise _unavailable(self.dead)
        if self._closed:
            raise RuntimeError("store is closed")
        fut: Future[T] = Future()
        # running from the start: cancel() is refused, so a caller that stops waiting (a client that hung up)
        # cannot leave the writer a future it may no longer resolve
        fut.set_running_or_notify_cancel()
        self._queue.put((fn, fut, single_statement))
        if self.dead is not None:  # it died between the check and the put: nobody would take this write
            self._fail_queued(self.dead)
        return fut

    @property
    def alive(self) -> bool:
        return self.dead is None and self._thread.is_alive()

    def close(self) -> None:
        """Commit what is queued, stop the thread and close the connection."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._thread.join()
        self._conn.close()

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # whatever ended the thread is reported, never swallowed
            self.dead = exc
            log.critical("the store's writer thread died; no write can succeed from now on", exc_info=exc)
            self._fail_queued(exc)
            if self.on_death is not None:
                try:
                    self.on_death(exc)
                except Exception:
                    log.exception("the writer's on_death callback failed")

    def _fail_queued(self, exc: BaseException) -> None:
        error = _unavailable(exc)
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not _STOP:
                _resolve(item[1], None, error)

    def _loop(self) -> None:
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
            try:
                run_batch(self._conn, batch)
            except Exception as exc:  # e.g. the rollback itself failed: this batch fails, the writer goes on
                log.exception("a batch of store writes failed outside any one write")
                for _, fut, _ in batch:
                    _resolve(fut, None, exc)
            except BaseException as exc:
                for _, fut, _ in batch:  # what was taken off the queue fails too, before the thread ends
                    _resolve(fut, None, _unavailable(exc))
                raise
            if stop:
                return


def run_batch(conn: sqlite3.Connection, batch: list[_Write]) -> None:
    """Run the writes of `batch` in one transaction, each in its own savepoint, then resolve their futures."""
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
            _resolve(fut, None, exc)
        return
    for fut, result, err in outcomes:
        _resolve(fut, result, err)


def _resolve(fut: Future[Any], result: Any, err: BaseException | None) -> None:
    """Resolve a write's future once; a future resolved already (by nobody here) is left as it is."""
    if fut.done():
        return
    try:
        if err is not None:
            fut.set_exception(err)
        else:
            fut.set_result(result)
    except InvalidStateError:  # resolved between the check and the call
        pass


def _unavailable(exc: BaseException) -> StoreUnavailable:
    why = f"{type(exc).__name__}: {exc}".rstrip(": ")
    return StoreUnavailable(f"the store's writer has stopped ({why}): restart agl serve")
