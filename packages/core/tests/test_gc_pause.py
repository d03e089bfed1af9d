"""Pausing the cycle collector for bulk reads and builds (agl.common.gc_pause): it is off inside, back on after, and
what the pause made ends in the oldest generation, without undoing objects the process froze itself."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from agl.common.gc_pause import gc_paused


class Record:  # a tracked object, as the read's records are
    def __init__(self, n: int) -> None:
        self.n = n


@pytest.fixture(autouse=True)
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def _made_in_a_pause(n: int = 5_000) -> list[Record]:
    with gc_paused():
        assert not gc.isenabled()
        return [Record(i) for i in range(n)]


def _in_generation(objects: list[Record], generation: int) -> int:
    ids = {id(o) for o in objects}
    return sum(id(o) in ids for o in gc.get_objects(generation=generation))


def test_the_collector_is_back_on_after_a_pause_and_what_it_made_is_oldest() -> None:
    gc.collect()
    made = _made_in_a_pause()
    assert gc.isenabled()
    assert _in_generation(made, 2) == len(made)
    assert _in_generation(made, 0) == 0


def test_a_pause_leaves_the_collector_off_if_it_was_off() -> None:
    gc.disable()
    made = _made_in_a_pause()
    assert not gc.isenabled()
    assert _in_generation(made, 0) == len(made)  # nothing moved: the process runs its collector itself


def test_objects_the_process_froze_stay_frozen() -> None:
    gc.collect()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        made = _made_in_a_pause()
        assert gc.get_freeze_count() == frozen
        assert _in_generation(made, 2) == len(made)  # moved by one middle-generation pass instead
    finally:
        gc.unfreeze()


def test_pauses_in_two_threads_turn_the_collector_back_on_when_the_last_ends() -> None:
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with gc_paused():
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=other)
    thread.start()
    inside.wait(10)
    _made_in_a_pause(10)
    assert not gc.isenabled()  # the other thread's pause still runs
    release.set()
    thread.join()
    assert gc.isenabled()
