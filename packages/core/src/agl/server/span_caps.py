"""Caps on span bodies checked before they are decoded (issue #41, N4): decoding is what costs, so the count comes
first. OTLP protobuf is counted on its wire format, without decoding a span; a JSON body is bounded by the objects and
lists it opens, counted with one pass over its bytes. 20 MB of 10M empty protobuf spans took 1.9 GB to decode, 30 MB
of empty JSON objects 2.1 GB."""

from __future__ import annotations

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


def check_json_containers(body: bytes, spans: int, *, what: str) -> None:
    """Refuse, before decoding, a JSON body that opens more objects and lists than `spans` spans would: an upper
    bound on what decoding it builds, counted in one pass over its bytes."""
    limit = CONTAINERS_PER_SPAN * spans + len(body) // BYTES_PER_CONTAINER + _CONTAINERS_FREE
    opened = body.count(b"{") + body.count(b"[")
    if opened > limit:
        raise TooManyContainers(
            f"{what} opens {opened} JSON objects and lists for {spans} spans in {len(body)} bytes, more than its"
            f" spans could hold ({limit}): send the spans' attributes, not empty structures"
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
