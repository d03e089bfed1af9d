"""The store's writer thread serves every client: nothing a caller does may end it, and if it ends anyway it
says so instead of leaving every write waiting forever (issue #27)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from agl.schema import TaskIn
from agl.server.app import Server
from agl.server.settings import ServerSettings
from agl.store import Store, StoreUnavailable
from agl.store import writer as writer_module


def test_a_caller_cannot_cancel_a_queued_write_and_the_write_still_runs(store: Store) -> None:
    gate = threading.Event()
    blocker = store.submit(lambda conn: gate.wait(5))  # holds the writer, so the next write stays queued
    queued = store.add_task(TaskIn(input="kept"))
    assert not queued.cancel()  # a client that hangs up stops waiting; it cannot take the write back
    gate.set()
    task = queued.result(5)
    assert blocker.result(5) is True
    assert store.get_task(task.id).input == "kept"
    assert store.add_task(TaskIn(input="next")).result(5).input == "next"


def test_an_asyncio_waiter_cancelled_mid_wait_leaves_the_writer_alive(store: Store) -> None:
    # what the proxy does: wrap the write's future and wait; the agent hangs up, the wait is cancelled
    gate = threading.Event()
    store.submit(lambda conn: gate.wait(5))
    write = store.add_task(TaskIn(input="cancelled wait"))

    async def wait_then_cancel() -> None:
        waiter = asyncio.ensure_future(asyncio.wrap_future(write))
        await asyncio.sleep(0.05)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter

    asyncio.run(wait_then_cancel())
    gate.set()
    assert write.result(5).input == "cancelled wait"
    assert store.writer.alive
    assert store.add_task(TaskIn(input="after")).result(5).input == "after"


def test_a_batch_that_fails_outside_any_write_fails_alone(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    real = writer_module.run_batch
    calls = [0]

    def flaky(conn: object, batch: list) -> None:  # type: ignore[type-arg]
        calls[0] += 1
        if calls[0] == 1:
            raise OSError("disk I/O error while rolling back")
        real(conn, batch)  # type: ignore[arg-type]

    monkeypatch.setattr(writer_module, "run_batch", flaky)
    with pytest.raises(OSError, match="disk I/O"):
        store.add_task(TaskIn(input="lost batch")).result(5)
    assert store.writer.alive
    assert store.add_task(TaskIn(input="next batch")).result(5).input == "next batch"


class _Death(BaseException):
    pass


def test_a_dead_writer_fails_queued_and_new_writes_and_tells_its_owner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    died: list[BaseException] = []
    gate = threading.Event()
    store = Store(tmp_path, on_writer_death=died.append)
    try:
        real = writer_module.run_batch

        def dying(conn: object, batch: list) -> None:  # type: ignore[type-arg]
            if any(item[2] is False and getattr(item[0], "__name__", "") == "die" for item in batch):
                raise _Death("the writer's own bug")
            real(conn, batch)  # type: ignore[arg-type]

        monkeypatch.setattr(writer_module, "run_batch", dying)
        store.submit(lambda conn: gate.wait(5))

        def die(conn: object) -> None:
            return None

        doomed = store.submit(die)
        queued_behind = store.add_task(TaskIn(input="behind"))
        gate.set()
        for write in (doomed, queued_behind):  # failed with the reason, not left waiting for nobody
            with pytest.raises(StoreUnavailable, match=r"writer has stopped.*the writer's own bug"):
                write.result(5)
        deadline = time.monotonic() + 5
        while not died and time.monotonic() < deadline:
            time.sleep(0.01)
        assert died and isinstance(died[0], _Death)
        assert not store.writer.alive
        with pytest.raises(StoreUnavailable, match="restart agl serve"):
            store.add_task(TaskIn(input="after death"))
    finally:
        store.close()


def test_health_is_503_with_the_reason_once_the_writer_is_dead(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fatal: list[BaseException] = []
    server = Server(ServerSettings(run_dir=tmp_path), on_fatal=fatal.append)
    try:
        assert asyncio.run(server.health())[0] == 200

        def dying(conn: object, batch: list) -> None:  # type: ignore[type-arg]
            raise _Death("gone")

        monkeypatch.setattr(writer_module, "run_batch", dying)
        with pytest.raises(StoreUnavailable):
            server.store.ping().result(5)
        status, body = asyncio.run(server.health())
        assert status == 503 and "writer has stopped" in body["store"]
        deadline = time.monotonic() + 5  # told from the writer's thread as it ends, just after the failures
        while not fatal and time.monotonic() < deadline:
            time.sleep(0.01)
        assert fatal and isinstance(fatal[0], _Death)  # the server was told, and `agl serve` exits on it
    finally:
        server.store.close()
