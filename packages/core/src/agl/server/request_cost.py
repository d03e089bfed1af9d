"""What a request body may cost before it is parsed: the size past which it is parsed off the event loop, and
the counts of structures and elements, made in its bytes, past which it is refused unparsed."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from agl.server.span_caps import count_bytes, count_elements

T = TypeVar("T")

# A request body (or an upstream's answer) this large is parsed and checked on a worker thread: walking a 12 MB
# body took the event loop 11 s, and every other request waited; a smaller one stays inline, where parsing costs
# less than the hop to a thread.
OFF_LOOP_BYTES = 256 * 1024

# a large body may open one JSON object or list per this many bytes: real requests (text, tool schemas) open one
# every 20 bytes or more, while 12 MB of empty lists, one every 3, held the interpreter lock in the JSON parser for
# seconds (a parser thread does not help there), stalling every other request
BYTES_PER_STRUCTURE = 8
# and at most this many in all (`agl serve --max-request-structures`): orjson parses 111k small objects in ~40 ms
# and 1.1M in ~0.9 s on a 2-core machine, all of it holding the interpreter lock, so health and every other call
# waited that long. The count includes braces inside strings, so it over-counts; even so a 128k-token context of
# JSON-heavy tool output opens about 15k, far under the cap.
MAX_REQUEST_STRUCTURES = 131_072


# and at most this many elements per structure of that cap (8 × --max-request-structures: 1,048,576 by default),
# counted in the bytes before parsing (`span_caps.count_elements`): each string, and each comma and colon outside
# strings, 1-4 per value or key (a content part or a tool schema's property counts ~8). Structures alone let one
# 30 MB list of 7.5M floats or one object of 2.2M keys through; six such took the server from 222 MB to 2 GB. A
# million parse into ~30-36 MB; a long agent conversation (2,000 tool calls with their results, 200 tool schemas)
# counts ~100k: the text inside strings is not counted.
ELEMENTS_PER_STRUCTURE = 8
MAX_REQUEST_ELEMENTS = ELEMENTS_PER_STRUCTURE * MAX_REQUEST_STRUCTURES


def count_structures(raw: bytes) -> int:
    """How many JSON objects and lists `raw` opens, at most: its `{` and `[`, inside strings too."""
    return count_bytes(raw, b"{[")


def structure_problem(
    raw: bytes, max_structures: int = MAX_REQUEST_STRUCTURES, max_elements: int | None = None, opened: int | None = None
) -> str | None:
    """Why a large body is refused before it is parsed: far more objects and lists, or elements (strings, numbers,
    keys: `count_elements`), than any request holds. `max_elements` defaults to ELEMENTS_PER_STRUCTURE ×
    `max_structures` (so `agl serve --max-request-structures` moves both); `opened`: `count_structures(raw)`, when
    the caller has counted it already."""
    if len(raw) <= OFF_LOOP_BYTES:
        return None  # at most ~128k elements fit in it: under the budget
    opened = count_structures(raw) if opened is None else opened
    if opened > len(raw) // BYTES_PER_STRUCTURE:
        return (
            f"request body opens {opened} JSON objects and lists in {len(raw)} bytes (at most one per"
            f" {BYTES_PER_STRUCTURE} bytes in a body over {OFF_LOOP_BYTES // 1024} KiB)"
        )
    if opened > max_structures:
        return (
            f"request body opens {opened} JSON objects and lists (counting braces and brackets inside strings);"
            f" at most {max_structures} are parsed (agl serve --max-request-structures)"
        )
    limit = ELEMENTS_PER_STRUCTURE * max_structures if max_elements is None else max_elements
    elements = count_elements(raw, limit)
    if elements > limit:
        return (
            f"request body holds at least {elements} JSON elements (strings, and commas and colons outside strings,"
            f" counted before parsing); at most {limit} are parsed ({ELEMENTS_PER_STRUCTURE} × agl serve"
            " --max-request-structures)"
        )
    return None


# Large bodies are checked, parsed and translated one at a time, on one thread. That work holds the interpreter lock
# (orjson, bytes.count), so two threads at it run no faster than one; but each extra thread is one more contender
# the event loop must win the lock back from after every poll, and six 30 MB bodies on six threads held health's
# p99 near 160 ms. In one lane the loop contends with a single thread.
_lane: ThreadPoolExecutor | None = None
_lane_made = threading.Lock()


async def heavy_lane(work: Callable[..., T], *args: Any) -> T:
    """`work(*args)` on the one thread that does a large body's CPU work (see above), in this context."""
    global _lane
    with _lane_made:
        if _lane is None:
            _lane = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agl-heavy")
    call = partial(contextvars.copy_context().run, work, *args)
    return await asyncio.get_running_loop().run_in_executor(_lane, call)
