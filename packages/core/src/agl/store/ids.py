"""Ids of stored records: a prefix and 64 random bits in hex (`ro-…`, `at-…`, `llm-…`)."""

from __future__ import annotations

import os
import random


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
