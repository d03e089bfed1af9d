"""The OTLP/HTTP traces receiver: turns an `ExportTraceServiceRequest` (protobuf or OTLP/JSON) into agl spans.

Spans that arrive here end in the store in the same shape as the built-in tracer's (`agl.capture.tracing.spans`): hex
ids, unix-second times, JSON attribute values, and `rollout_id` / `attempt_id` / `agent_name` read from the
span's `agl.*` attributes, else from its resource's (and then copied into the attributes, so both read alike).
One more attribute says which instrumentation made the span, as OpenTelemetry's conventions for non-OTLP
formats do: `otel.scope.name`, when the sender named its scope. Links and dropped counts are not kept.

Input that breaks the OTLP spec is refused as a whole with a `ValueError` naming the place
(`resourceSpans[0].scopeSpans[1].spans[3].traceId: ...`); the server answers 400, which OTLP exporters do not
retry. Two things the spec itself allows are accepted rather than refused: an empty span name (stored as
"(unnamed)", the store needs one) and an all-zero parent span id (read as "no parent", like an empty one).

Speed matters (the receiver must keep up with tens of thousands of spans a second), so every value is checked
here once, by hand, and the spans are built from those checked values without a second pydantic validation
pass (which would cost as much again as all the parsing). Every field therefore meets `SpanIn`'s constraints
by construction; `tests/test_otlp.py` re-validates the parsed spans to keep it so.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Iterable, Mapping
from typing import Any

import orjson
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from agl.common import attributes as attr
from agl.schema import INT64_MIN, MAX_TIMESTAMP, SpanIn, SpanStatus
from agl.server.span_caps import check_json_containers, count_protobuf_spans, too_many

PROTOBUF = "application/x-protobuf"
JSON = "application/json"

_KINDS = ("unspecified", "internal", "server", "client", "producer", "consumer")
_KIND_NAMES = {f"SPAN_KIND_{k.upper()}": k for k in _KINDS}
_STATUSES = (SpanStatus.unset, SpanStatus.ok, SpanStatus.error)
_STATUS_NAMES = {f"STATUS_CODE_{s.value.upper()}": s for s in _STATUSES}
_ZERO_TRACE = bytes(16)
_ZERO_SPAN = bytes(8)
_MAX_NAME = 1000  # SpanIn.name's limit
_MAX_DEPTH = 32  # nesting of array / kvlist attribute values
_INT64 = (INT64_MIN, 2**63 - 1)
UINT64_MAX = 2**64 - 1
_NON_FINITE = frozenset({"NaN", "Infinity", "-Infinity"})
_SCOPE_NAME = "otel.scope.name"

_EMPTY_PROTOBUF_RESPONSE = ExportTraceServiceResponse().SerializeToString()


class _Invalid(Exception):
    """A problem with one field of one span; the caller adds where the span is."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(field, message)
        self.field = field
        self.message = message


# ---------------------------------------------------------------------------------------------- public


DEFAULT_MAX_SPANS = 10_000  # per request; OpenTelemetry's batch processor exports 512 at a time


def parse_otlp_traces(body: bytes, content_type: str, max_spans: int = DEFAULT_MAX_SPANS) -> list[SpanIn]:
    """The spans of one OTLP/HTTP export request (`body` already decompressed). Raises `ValueError`, and
    `TooManySpans` past `max_spans`: counted before any span is built, since building 300,000 of them took 900 MB."""
    if content_type == PROTOBUF:
        # counted on the wire before decoding: decoding 10M empty spans (20 MB) took 1.9 GB (issue #41, N4)
        count_protobuf_spans(body, max_spans)
        return _parse_protobuf(body, max_spans)
    if content_type == JSON:
        # every JSON span names its spanId: more names than the limit, and the body is refused undecoded
        named = body.count(b'"spanId"')
        if named > max_spans:
            raise too_many(named, max_spans)
        check_json_containers(body, named, what="this OTLP JSON body")
        return _parse_json(body, max_spans)
    raise ValueError(f"unsupported OTLP content type {content_type!r}: use {PROTOBUF} or {JSON}")


def otlp_success_response(content_type: str) -> tuple[bytes, str]:
    """The body and media type of a full-success `ExportTraceServiceResponse`, in the request's encoding."""
    if content_type == JSON:
        return b"{}", JSON
    return _EMPTY_PROTOBUF_RESPONSE, PROTOBUF


# ------------------------------------------------------------------------------------- shared helpers


def _seconds(nanos: int, field: str) -> float:
    if nanos <= 0:
        raise _Invalid(field, "missing or zero: spans need a start and an end time (unix nanoseconds)")
    seconds = nanos / 1e9
    if seconds > MAX_TIMESTAMP:
        raise _Invalid(field, f"{nanos} ns is after the year 5000: not a unix time in nanoseconds")
    return seconds


def _non_finite(value: float) -> str:
    # JSON has no NaN or infinity (and the store refuses them): keep them as OTLP/JSON writes them.
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


class _Origin:
    """What a resource and its scope give every span under them: agl ids and the instrumentation's name."""

    __slots__ = ("agent_name", "attempt_id", "rollout_id", "scope_name")

    def __init__(self, resource_attrs: Mapping[str, Any], scope_name: str) -> None:
        self.rollout_id = resource_attrs.get(attr.ROLLOUT_ID)
        self.attempt_id = resource_attrs.get(attr.ATTEMPT_ID)
        self.agent_name = resource_attrs.get(attr.AGENT_NAME)
        self.scope_name = scope_name


# A valid span that each parsed span is copied from with every field replaced: `model_copy(update=...)` is
# pydantic's documented way to make a model from trusted values, and about twice as fast as `model_construct`.
_TEMPLATE = SpanIn(trace_id="1" * 32, span_id="1" * 16, name="template", start_time=1.0, end_time=1.0, source="otlp")


def _build(
    trace_id: str,
    span_id: str,
    parent_id: str | None,
    name: str,
    kind: str,
    start: float,
    end: float,
    attributes: dict[str, Any],
    status: SpanStatus,
    status_message: str,
    events: list[dict[str, Any]],
    origin: _Origin,
) -> SpanIn:
    if end < start:
        raise _Invalid("endTimeUnixNano", f"end time {end} is before start time {start}")
    if not name:
        name = "(unnamed)"
    elif len(name) > _MAX_NAME:
        name = name[:_MAX_NAME]
    # agl's ids: the span's own attributes first, else its resource's (copied in, so both kinds read alike)
    rollout_id = attributes.get(attr.ROLLOUT_ID)
    if rollout_id is None and origin.rollout_id is not None:
        rollout_id = attributes[attr.ROLLOUT_ID] = origin.rollout_id
    attempt_id = attributes.get(attr.ATTEMPT_ID)
    if attempt_id is None and origin.attempt_id is not None:
        attempt_id = attributes[attr.ATTEMPT_ID] = origin.attempt_id
    agent_name = attributes.get(attr.AGENT_NAME)
    if agent_name is None and origin.agent_name is not None:
        agent_name = attributes[attr.AGENT_NAME] = origin.agent_name
    if origin.scope_name and _SCOPE_NAME not in attributes:
        attributes[_SCOPE_NAME] = origin.scope_name
    return _TEMPLATE.model_copy(
        update={
            "trace_id": trace_id,
            "span_id": span_id,
            "parent_id": parent_id,
            "name": name,
            "kind": kind,
            "start_time": start,
            "end_time": end,
            "attributes": attributes,
            "status": status,
            "status_message": status_message or None,
            "events": events,
            "rollout_id": rollout_id if rollout_id is None or isinstance(rollout_id, str) else str(rollout_id),
            "attempt_id": attempt_id if attempt_id is None or isinstance(attempt_id, str) else str(attempt_id),
            "agent_name": agent_name if agent_name is None or isinstance(agent_name, str) else str(agent_name),
            "source": "otlp",
        }
    )


def _where(ri: int, si: int, ki: int) -> str:
    return f"resourceSpans[{ri}].scopeSpans[{si}].spans[{ki}]"


# ---------------------------------------------------------------------------------------------- protobuf


def _pb_value(v: Any, depth: int = 0) -> Any:
    which = v.WhichOneof("value")
    if which == "string_value":
        return v.string_value
    if which == "int_value":
        return v.int_value
    if which == "bool_value":
        return v.bool_value
    if which == "double_value":
        d = v.double_value
        return d if math.isfinite(d) else _non_finite(d)
    if which is None:
        return None
    if depth >= _MAX_DEPTH:
        raise _Invalid("attributes", f"values nested deeper than {_MAX_DEPTH} levels")
    if which == "array_value":
        return [_pb_value(x, depth + 1) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _pb_value(kv.value, depth + 1) for kv in v.kvlist_value.values}
    if which == "bytes_value":
        return base64.b64encode(v.bytes_value).decode("ascii")
    return None


def _pb_attrs(kvs: Iterable[Any]) -> dict[str, Any]:
    return {kv.key: _pb_value(kv.value) for kv in kvs}


def _pb_id(raw: bytes, size: int, zero: bytes, field: str) -> str:
    if len(raw) != size:
        raise _Invalid(field, f"expected {size} bytes, got {len(raw)}")
    if raw == zero:
        raise _Invalid(field, "all-zero ids are invalid")
    return raw.hex()


def _parse_protobuf(body: bytes, max_spans: int) -> list[SpanIn]:
    try:
        request = ExportTraceServiceRequest.FromString(body)
    except (DecodeError, RuntimeError) as exc:  # RuntimeError: upb's "recursion limit exceeded"
        raise ValueError(f"OTLP protobuf body could not be parsed: {exc}") from None
    count = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
    if count > max_spans:
        raise too_many(count, max_spans)
    out: list[SpanIn] = []
    for ri, rs in enumerate(request.resource_spans):
        try:
            resource_attrs = _pb_attrs(rs.resource.attributes)
        except _Invalid as exc:
            raise ValueError(f"resourceSpans[{ri}].resource.{exc.field}: {exc.message}") from None
        for si, ss in enumerate(rs.scope_spans):
            origin = _Origin(resource_attrs, ss.scope.name)
            for ki, sp in enumerate(ss.spans):
                try:
                    out.append(_pb_span(sp, origin))
                except _Invalid as exc:
                    raise ValueError(f"{_where(ri, si, ki)}.{exc.field}: {exc.message}") from None
    return out


def _pb_span(sp: Any, origin: _Origin) -> SpanIn:
    trace_id = _pb_id(sp.trace_id, 16, _ZERO_TRACE, "traceId")
    span_id = _pb_id(sp.span_id, 8, _ZERO_SPAN, "spanId")
    raw_parent = sp.parent_span_id
    parent_id = (
        None if not raw_parent or raw_parent == _ZERO_SPAN else _pb_id(raw_parent, 8, _ZERO_SPAN, "parentSpanId")
    )
    kind_code = sp.kind
    if not 0 <= kind_code < len(_KINDS):
        raise _Invalid("kind", f"unknown span kind {kind_code}")
    status = sp.status
    code = status.code
    if not 0 <= code < len(_STATUSES):
        raise _Invalid("status.code", f"unknown status code {code}")
    events = [
        {"name": ev.name, "time": ev.time_unix_nano / 1e9, "attributes": _pb_attrs(ev.attributes)} for ev in sp.events
    ]
    return _build(
        trace_id,
        span_id,
        parent_id,
        sp.name,
        _KINDS[kind_code],
        _seconds(sp.start_time_unix_nano, "startTimeUnixNano"),
        _seconds(sp.end_time_unix_nano, "endTimeUnixNano"),
        _pb_attrs(sp.attributes),
        _STATUSES[code],
        status.message,
        events,
        origin,
    )


# -------------------------------------------------------------------------------------------------- JSON
# OTLP/JSON is the proto3 JSON mapping with lowerCamelCase keys, except that trace and span ids are hex (not
# base64). 64-bit integers come as decimal strings or numbers, enums as integers (their names are accepted too),
# and unknown keys are ignored, as the spec asks of receivers.


def _j_obj(value: Any, field: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _Invalid(field, f"expected an object, got {type(value).__name__}")
    return value


def _j_list(value: Any, field: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _Invalid(field, f"expected an array, got {type(value).__name__}")
    return value


def _j_str(value: Any, field: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _Invalid(field, f"expected a string, got {type(value).__name__}")
    return value


def _j_int(value: Any, field: str) -> int:
    """An int64 / uint64, which OTLP/JSON writes as a decimal string or a number."""
    if value is None:
        return 0
    if isinstance(value, bool):
        raise _Invalid(field, "expected an integer, got a boolean")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str):
        try:
            n = int(value, 10)
        except ValueError:
            raise _Invalid(field, f"expected an integer, got {value[:40]!r}") from None
    elif isinstance(value, float) and value.is_integer():
        n = int(value)
    else:
        raise _Invalid(field, f"expected an integer, got {value!r}")
    if not INT64_MIN <= n <= UINT64_MAX:  # OTLP integers are int64 or uint64
        shown = str(n) if len(str(n)) <= 30 else str(n)[:30] + "…"
        raise _Invalid(field, f"{shown} is out of the int64 / uint64 range")
    return n


def _j_id(value: Any, size: int, field: str) -> str:
    if not isinstance(value, str) or len(value) != 2 * size:
        shown = repr(value[:60]) if isinstance(value, str) else type(value).__name__
        raise _Invalid(field, f"expected {2 * size} hex characters (OTLP/JSON ids are hex, not base64), got {shown}")
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raw = b""
    if len(raw) != size:
        raise _Invalid(field, f"expected {2 * size} hex characters, got {value!r}")
    if raw == bytes(size):
        raise _Invalid(field, "all-zero ids are invalid")
    return raw.hex()


def _j_enum(value: Any, names: Mapping[str, Any], options: tuple[Any, ...], field: str) -> Any:
    if value is None:
        return options[0]
    if isinstance(value, str):
        found = names.get(value)
        if found is None:
            raise _Invalid(field, f"unknown value {value[:60]!r}; expected one of {', '.join(names)}")
        return found
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(options):
        return options[value]
    raise _Invalid(field, f"unknown value {value!r}; expected 0-{len(options) - 1} or one of {', '.join(names)}")


def _j_value(v: Any, depth: int) -> Any:
    """An AnyValue as a JSON value. Problems are raised with a field relative to the value ("" for itself)."""
    if not isinstance(v, dict):
        if v is None:
            return None
        raise _Invalid("", f"expected an AnyValue object, got {type(v).__name__}")
    if "stringValue" in v:
        return _j_str(v["stringValue"], "stringValue")
    if "intValue" in v:
        n = _j_int(v["intValue"], "intValue")
        if not _INT64[0] <= n <= _INT64[1]:
            raise _Invalid("intValue", f"{n} is out of the int64 range")
        return n
    if "boolValue" in v:
        b = v["boolValue"]
        if not isinstance(b, bool):
            raise _Invalid("boolValue", f"expected true or false, got {b!r}")
        return b
    if "doubleValue" in v:
        return _j_double(v["doubleValue"])
    if depth >= _MAX_DEPTH and ("arrayValue" in v or "kvlistValue" in v):
        raise _Invalid("", f"values nested deeper than {_MAX_DEPTH} levels")
    if "arrayValue" in v:
        out = []
        for i, x in enumerate(_j_list(_j_obj(v["arrayValue"], "arrayValue").get("values"), "arrayValue.values")):
            try:
                out.append(_j_value(x, depth + 1))
            except _Invalid as exc:
                raise _Invalid(_join(f"arrayValue.values[{i}]", exc.field), exc.message) from None
        return out
    if "kvlistValue" in v:
        return _j_attrs(_j_obj(v["kvlistValue"], "kvlistValue").get("values"), "kvlistValue.values", depth + 1)
    if "bytesValue" in v:
        text = _j_str(v["bytesValue"], "bytesValue")
        try:
            raw = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            try:
                raw = base64.urlsafe_b64decode(text)
            except (binascii.Error, ValueError):
                raise _Invalid("bytesValue", f"not base64: {text[:40]!r}") from None
        return base64.b64encode(raw).decode("ascii")
    return None


def _join(field: str, sub: str) -> str:
    return f"{field}.{sub}" if sub else field


def _j_double(d: Any) -> Any:
    field = "doubleValue"
    if isinstance(d, bool):
        raise _Invalid(field, "expected a number, got a boolean")
    if isinstance(d, (int, float)):
        f = float(d)
        return f if math.isfinite(f) else _non_finite(f)
    if isinstance(d, str):
        if d in _NON_FINITE:
            return d
        try:
            f = float(d)
        except ValueError:
            raise _Invalid(field, f"expected a number, got {d[:40]!r}") from None
        return f if math.isfinite(f) else _non_finite(f)
    raise _Invalid(field, f"expected a number, got {type(d).__name__}")


def _j_attrs(kvs: Any, field: str = "attributes", depth: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i, kv in enumerate(_j_list(kvs, field)):
        if not isinstance(kv, dict):
            raise _Invalid(f"{field}[{i}]", f"expected a {{key, value}} object, got {type(kv).__name__}")
        key = kv.get("key")
        if not isinstance(key, str):
            raise _Invalid(f"{field}[{i}].key", f"expected a string, got {type(key).__name__}")
        try:
            out[key] = _j_value(kv.get("value"), depth)
        except _Invalid as exc:
            raise _Invalid(_join(f"{field}[{i}].value", exc.field), exc.message) from None
    return out


def _j_span(sp: Any, origin: _Origin) -> SpanIn:
    if not isinstance(sp, dict):
        raise _Invalid("", f"expected a span object, got {type(sp).__name__}")
    trace_id = _j_id(sp.get("traceId"), 16, "traceId")
    span_id = _j_id(sp.get("spanId"), 8, "spanId")
    raw_parent = sp.get("parentSpanId")
    parent_id = None if not raw_parent or raw_parent == "0" * 16 else _j_id(raw_parent, 8, "parentSpanId")
    status = _j_obj(sp.get("status"), "status")
    events = []
    for i, ev in enumerate(_j_list(sp.get("events"), "events")):
        try:
            ev = _j_obj(ev, "")
            events.append(
                {
                    "name": _j_str(ev.get("name"), "name"),
                    "time": _j_int(ev.get("timeUnixNano"), "timeUnixNano") / 1e9,
                    "attributes": _j_attrs(ev.get("attributes")),
                }
            )
        except _Invalid as exc:
            raise _Invalid(_join(f"events[{i}]", exc.field), exc.message) from None
    return _build(
        trace_id,
        span_id,
        parent_id,
        _j_str(sp.get("name"), "name"),
        _j_enum(sp.get("kind"), _KIND_NAMES, _KINDS, "kind"),
        _seconds(_j_int(sp.get("startTimeUnixNano"), "startTimeUnixNano"), "startTimeUnixNano"),
        _seconds(_j_int(sp.get("endTimeUnixNano"), "endTimeUnixNano"), "endTimeUnixNano"),
        _j_attrs(sp.get("attributes")),
        _j_enum(status.get("code"), _STATUS_NAMES, _STATUSES, "status.code"),
        _j_str(status.get("message"), "status.message"),
        events,
        origin,
    )


def _parse_json(body: bytes, max_spans: int) -> list[SpanIn]:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"OTLP JSON body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"OTLP JSON body must be an object with 'resourceSpans', got {type(doc).__name__}")
    out: list[SpanIn] = []
    ri = si = ki = -1  # where we are, for messages (built only when something is wrong)
    key = "scopeSpans"
    try:
        for ri, rs in enumerate(_j_list(doc.get("resourceSpans"), "")):  # noqa: B007 - the indices are read in `except`
            si = ki = -1
            rs = _j_obj(rs, "")
            resource = _j_obj(rs.get("resource"), "resource")
            resource_attrs = _j_attrs(resource.get("attributes"), "resource.attributes")
            legacy = "scopeSpans" not in rs and "instrumentationLibrarySpans" in rs
            key = "instrumentationLibrarySpans" if legacy else "scopeSpans"
            for si, ss in enumerate(_j_list(rs.get(key), key)):  # noqa: B007
                ki = -1
                ss = _j_obj(ss, "")
                scope = _j_obj(ss.get("instrumentationLibrary" if legacy else "scope"), "scope")
                origin = _Origin(resource_attrs, _j_str(scope.get("name"), "scope.name"))
                for ki, sp in enumerate(_j_list(ss.get("spans"), "spans")):  # noqa: B007
                    out.append(_j_span(sp, origin))
                    if len(out) > max_spans:  # the pre-count missed some (escaped key names)
                        raise too_many(len(out), max_spans)
    except _Invalid as exc:
        if ri < 0:
            at = "resourceSpans"
        elif si < 0:
            at = f"resourceSpans[{ri}]"
        elif ki < 0:
            at = f"resourceSpans[{ri}].{key}[{si}]"
        else:
            at = f"resourceSpans[{ri}].{key}[{si}].spans[{ki}]"
        raise ValueError(f"{_join(at, exc.field)}: {exc.message}") from None
    return out
