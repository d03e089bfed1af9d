"""The trainer process's own memory: what it holds now, and giving back what it freed.

glibc keeps memory a process frees in its heaps for reuse rather than returning it to the system, one heap
(arena) per thread that allocated: after an update's activations are freed the trainer still held 7.3 GB of the
10.5 GB its first update peaked at (the main job, measured with benchmarks/perf/bench_memory.py). `give_back`
asks glibc to return every free page (`malloc_trim(0)`, which since glibc 2.8 also releases whole free pages in
the middle of a heap); it costs a few milliseconds and is done between micro-batches and after each phase.
Elsewhere (macOS, musl) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc
        return None
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def give_back() -> None:
    """Return the memory this process has freed to the system (glibc); nothing elsewhere."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def resident_bytes() -> int:
    """This process's resident memory now (0 where /proc is not there)."""
    try:
        with open(f"/proc/{os.getpid()}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def peak_resident_bytes(pid: int | None = None) -> int:
    """The resident high-water mark (VmHWM) of this process, or of `pid`; 0 where /proc has none."""
    try:
        with open(f"/proc/{pid or os.getpid()}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0
