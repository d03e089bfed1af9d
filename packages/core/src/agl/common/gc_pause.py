"""Pausing Python's cycle collector while a step's data is read and turned into transitions.

Reading a step's rollouts back (agl.store.reads) and building their transitions (agl.learn.transitions) each make
tens of thousands of container objects (row tuples, records, transitions, lists) that form no reference
cycles. The cycle collector is triggered by that count alone, and each of its older-generation passes walks
every tracked object of the process (in the trainer: the model's Python objects too), again and again, for
nothing: a fifth to a third of reading a step's calls back. Pausing it is safe here, since nothing made under
the pause needs it; pauses in several threads share one (a count), and the collector is turned back on only if
it was on when the first of them began.

What the pause made and still holds has, by then, outlived the step that made it, and holds no cycles: a walk of
it would find nothing to free. Left young, the collector would walk it in a young pass as soon as it is back on,
then again in a middle-generation pass a few thousand allocations later (two thirds of a credit assignment after
a read), before moving it to the oldest generation, which only full collections walk. So the pause ends by
moving every young object to the oldest generation at once, walking none: `gc.freeze()` then `gc.unfreeze()`,
which the gc module documents as putting the frozen objects back into the oldest generation. What it made is
then walked by the next full collection if it still exists (a step's records are usually gone by then); cyclic
garbage that other code left young waits for that collection too. Where the process froze objects itself
(`gc.freeze` before forking), unfreezing would undo that, so the pause ends with one middle-generation pass
instead: the same move, in one walk.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_holders = 0
_was_enabled = False


@contextmanager
def gc_paused() -> Iterator[None]:
    global _holders, _was_enabled
    with _lock:
        if _holders == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _was_enabled:
                gc.enable()
                if gc.get_count()[0] > gc.get_threshold()[0]:  # more left than a young pass would let by
                    _to_oldest_generation()


def _to_oldest_generation() -> None:
    if gc.get_freeze_count() == 0:
        gc.freeze()
        gc.unfreeze()
    else:
        gc.collect(1)
