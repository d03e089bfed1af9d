"""Pausing Python's cycle collector while a step's data is read and turned into transitions.

Reading a step's rollouts back (agl.store.reads) and building their transitions (agl.transitions) each make
tens of thousands of container objects (row tuples, records, transitions, lists) that form no reference
cycles. The cycle collector is triggered by that count alone, and each of its older-generation passes walks
every tracked object of the process (in the trainer: the model's Python objects too), again and again, for
nothing: a fifth to a third of reading a step's calls back. Pausing it is safe here, since nothing made under
the pause needs it; pauses in several threads share one (a count), and the collector is turned back on only if
it was on when the first of them began.
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
