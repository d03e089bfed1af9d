"""The store's single writer: one thread that commits whatever has queued up in one transaction (group commit).

Many concurrent requests cost one fsync-free WAL commit, and a caller's future resolves only after its write is
committed, so anything acknowledged survives a crash of the server process. Each write runs inside its own
SAVEPOINT, so one bad write fails alone and never rolls back its neighbours.
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

_STOP = object()
_Write = tuple[Callable[[sqlite3.Connection], Any], "Future[Any]", bool]


class Writer:
    """Runs writes (functions of the connection) on `conn` from one thread, up to `max_batch` per commit."""

    def __init__(self, conn: sqlite3.Connection, *, max_batch: int = 1024, name: str = "agl-store-writer") -> None:
        self._conn = conn
        self._max_batch = max_batch
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

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

    def close(self) -> None:
        """Commit what is queued, stop the thread and close the connection."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._thread.join()
        self._conn.close()

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
            run_batch(self._conn, batch)
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
            if not fut.done():
                fut.set_exception(exc)
        return
    for fut, result, err in outcomes:
        if err is not None:
            fut.set_exception(err)
        else:
            fut.set_result(result)
