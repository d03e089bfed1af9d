"""Caps on span bodies checked before they are decoded (issue #41, N4): decoding is what costs, so the count comes
first. OTLP protobuf is counted on its wire format, without decoding a span; a JSON body is bounded by the objects and
lists it opens, counted with one pass over its bytes. 20 MB of 10M empty protobuf spans took 1.9 GB to decode, 30 MB
of empty JSON objects 2.1 GB. JSON bodies are also bounded by their elements (strings, and commas and colons outside
strings), counted in the bytes (`count_elements`): duplicate keys, which a parser keeps one of, count too."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator


class TooManySpans(ValueError):
    """An export request with more spans than the server takes in one request (HTTP 413)."""


def too_many(count: int, limit: int, *, at_least: bool = False) -> TooManySpans:
    holds = f"more than {limit}" if at_least else str(count)  # counting stops past the limit
    return TooManySpans(
        f"this export request holds {holds} spans, over the limit of {limit} per request: export in smaller"
        " batches (agl serve --max-spans-per-request)"
    )


# objects and lists a span's JSON may open (its attributes, events, links and their values) before the body is
# refused undecoded: 30 MB of empty objects became 2.1 GB of Python dicts. Brackets inside strings count too (GenAI
# spans carry messages and tool schemas as JSON text), so a body also gets one per BYTES_PER_CONTAINER of its size:
# escaped JSON text opens one about every 20-30 bytes, empty objects one every 3.
CONTAINERS_PER_SPAN = 256
BYTES_PER_CONTAINER = 24
_CONTAINERS_FREE = 4096


class TooManyContainers(TooManySpans):
    """A JSON body with far more objects and lists than its spans could hold (HTTP 413)."""


# the rest of one JSON string after its opening quote, through its closing one (escapes skipped; no backtracking:
# the alternatives cannot overlap)
_STRING_REST = re.compile(rb'[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
# one walk of a large body at a time: six walking at once on six threads left the event loop one turn in seven at
# the interpreter lock (health's p99 near 200 ms); in turn, each walk shares it with the loop alone. A body up to
# LOCKED_WALK_BYTES (at most ~128k strings: ~0.1 s) is walked without it, so the event loop never waits on it.
_WALKING = threading.Lock()
LOCKED_WALK_BYTES = 256 * 1024


# bytes counted per call of `bytes.count`: one call over 30 MB holds the interpreter lock ~8 ms, and six bodies
# counted at once kept the event loop waiting behind them; between windows of 1 MiB (~0.3 ms) other threads run
_COUNT_WINDOW = 1 << 20


def count_bytes(raw: bytes, chars: bytes, start: int = 0, end: int | None = None) -> int:
    """How many of `raw[start:end]`'s bytes are any of `chars`, counted a window at a time (`_COUNT_WINDOW`)."""
    end = len(raw) if end is None else end
    total = 0
    for at in range(start, end, _COUNT_WINDOW):
        stop = min(at + _COUNT_WINDOW, end)
        total += sum(raw.count(chars[i : i + 1], at, stop) for i in range(len(chars)))
    return total


def count_elements(raw: bytes, limit: int) -> int:
    """The elements of a JSON text, counted in its bytes without parsing it: each string, and each comma and colon
    outside strings, about two per value or key (duplicate keys count, which a count after parsing misses). At most
    `limit` is counted exactly: past it the result is some number over `limit`, so the cost is bounded by `limit`.

    First an upper bound at C speed (quotes / 2 plus every comma and colon), enough for nearly every body; only a
    body over it is walked string by string (one regex match per string, the commas and colons between strings
    counted with `bytes.count`): a loop in Python, so other threads run between strings, of at most about `limit`
    steps, one large body at a time (call it off the event loop for a body over LOCKED_WALK_BYTES). An
    unterminated string ends the count: the parser refuses such a body anyway."""
    rough = count_bytes(raw, b'"') // 2 + count_bytes(raw, b",:")
    if rough <= limit:
        return rough
    if len(raw) <= LOCKED_WALK_BYTES:
        return _walk(raw, limit)
    with _WALKING:
        return _walk(raw, limit)


def _walk(raw: bytes, limit: int) -> int:
    count = pos = 0
    end = len(raw)
    while count <= limit:
        quote = raw.find(b'"', pos)
        stop = end if quote < 0 else quote
        if stop - pos > _COUNT_WINDOW:
            count += count_bytes(raw, b",:", pos, stop)
        else:  # the common case, kept to two calls: this loop runs once a string
            count += raw.count(b",", pos, stop) + raw.count(b":", pos, stop)
        if quote < 0:
            break
        closed = _STRING_REST.match(raw, quote + 1)
        if closed is None:
            break
        count += 1
        pos = closed.end()
    return count


# elements (`count_elements`) a span's JSON may hold: its own fields count ~50, OTLP's verbose attributes ~10 each
# (128, OpenTelemetry's default limit, ~1,300); plus one per BYTES_PER_ELEMENT of the body for structured attribute
# values (a list of numbers holds one every 4-8 bytes). One span of 10,000 duplicate keys (~30,000) is refused.
ELEMENTS_PER_SPAN = 2048
BYTES_PER_ELEMENT = 8
_ELEMENTS_FREE = 4096


def check_json_containers(body: bytes, spans: int, *, what: str) -> None:
    """Refuse, before decoding, a JSON body that opens more objects and lists, or holds more elements (duplicate
    keys included), than `spans` spans would: an upper bound on what decoding it builds, counted in its bytes."""
    limit = CONTAINERS_PER_SPAN * spans + len(body) // BYTES_PER_CONTAINER + _CONTAINERS_FREE
    opened = count_bytes(body, b"{[")
    if opened > limit:
        raise TooManyContainers(
            f"{what} opens {opened} JSON objects and lists for {spans} spans in {len(body)} bytes, more than its"
            f" spans could hold ({limit}): send the spans' attributes, not empty structures"
        )
    limit = ELEMENTS_PER_SPAN * spans + len(body) // BYTES_PER_ELEMENT + _ELEMENTS_FREE
    elements = count_elements(body, limit)
    if elements > limit:
        raise TooManyContainers(
            f"{what} holds at least {elements} JSON elements (strings, and commas and colons outside strings:"
            f" duplicate keys count) for {spans} spans in {len(body)} bytes, more than its spans could hold ({limit})"
        )


def count_protobuf_spans(body: bytes, limit: int) -> int:
    """The spans of an `ExportTraceServiceRequest`, counted on the wire format (resource_spans = 1 → scope_spans = 2
    → spans = 2) without decoding any of them; `TooManySpans` as soon as the count passes `limit`, or when the
    levels above the spans hold more fields than that many spans could come with. Malformed framing is left to
    the decoder's own error."""
    seen = [0, 0]  # spans, fields walked above the spans

    def walk(start: int, end: int, depth: int) -> None:
        for field, wire, value_start, value_end in _pb_fields(body, start, end):
            seen[1] += 1
            if seen[1] > 2 * limit + _CONTAINERS_FREE:
                raise TooManySpans(
                    f"this export request holds over {2 * limit + _CONTAINERS_FREE} fields around its spans: export"
                    " in smaller batches (agl serve --max-spans-per-request)"
                )
            if wire != 2 or field != (1 if depth == 0 else 2):
                continue
            if depth < 2:
                walk(value_start, value_end, depth + 1)
                continue
            seen[0] += 1
            if seen[0] > limit:
                raise too_many(seen[0], limit, at_least=True)

    try:
        walk(0, len(body), 0)
    except _Malformed:
        pass  # the decoder says what is wrong, with its own words
    return seen[0]


class _Malformed(Exception):
    pass


def _pb_varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise _Malformed
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _pb_fields(buf: bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, start, end of its value) of each field of one message, skipping over values."""
    pos = start
    while pos < end:
        tag, pos = _pb_varint(buf, pos, end)
        wire = tag & 7
        if wire == 0:
            _, after = _pb_varint(buf, pos, end)
        elif wire == 1:
            after = pos + 8
        elif wire == 2:
            size, pos = _pb_varint(buf, pos, end)
            after = pos + size
        elif wire == 5:
            after = pos + 4
        else:
            raise _Malformed  # groups: not in the OTLP schema
        if after > end:
            raise _Malformed
        yield tag >> 3, wire, pos, after
        pos = after
