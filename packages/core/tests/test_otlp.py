"""The OTLP/HTTP receiver and the OpenTelemetry helper.

Spans come from the real OpenTelemetry SDK and its own OTLP encoder; the same request is parsed as protobuf and
as OTLP/JSON and must give identical spans. Bad input is refused with a message naming the field. At the end,
the SDK exports over real HTTP to a real `agl serve` process, and the spans are read back from the store.
"""

from __future__ import annotations

import base64
import copy
import gzip
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue, KeyValueList
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

from agl.capture.tracing import otel
from agl.capture.tracing.context import RolloutContext, reset_rollout, set_rollout
from agl.capture.tracing.spans import agent
from agl.client import Client
from agl.common import attributes as attr
from agl.common.processes import ServerProcess, start_server
from agl.schema import SpanIn, SpanStatus
from agl.server.otlp import otlp_success_response, parse_otlp_traces

PB = "application/x-protobuf"
JSON = "application/json"
API = "/api/v1"

SQL_ATTRIBUTES: dict[str, Any] = {
    "gen_ai.tool.name": "sql",
    "agl.span.kind": "tool",
    "rows": 3,
    "big": 2**62,
    "negative": -7,
    "score": 0.25,
    "flag": False,
    "tags": ("a", "b"),
    "ints": (1, 2, 3),
    "floats": (0.5, 1.5),
    "bools": (True, False),
    "blob": b"\x00\xffagl",
    "nested": {"user": {"id": 1, "roles": ["admin"]}, "ok": True},
}


# ------------------------------------------------------------------------------------------------ helpers


def sdk_spans() -> list[ReadableSpan]:
    """Real SDK spans: an agent root with a failing tool call (with an event) and a server child."""
    exporter = InMemorySpanExporter()
    resource = Resource.create({"service.name": "test-agent", attr.ROLLOUT_ID: "ro-from-resource"})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("agl.tests", "1.2.3")
    with tracer.start_as_current_span(
        "agent:writer", attributes={attr.ROLLOUT_ID: "ro-1", attr.ATTEMPT_ID: "at-1", attr.AGENT_NAME: "writer"}
    ) as root:
        root.set_status(Status(StatusCode.OK))
        with tracer.start_as_current_span("tool:sql", kind=SpanKind.CLIENT, attributes=SQL_ATTRIBUTES) as tool:
            tool.add_event("retry", {"attempt": 2, "why": "locked"})
            tool.set_status(Status(StatusCode.ERROR, "near 'SELEC': syntax error"))
        with tracer.start_as_current_span("handle", kind=SpanKind.SERVER):
            pass
    provider.shutdown()
    spans = list(exporter.get_finished_spans())
    assert len(spans) == 3
    return spans


def to_otlp_json(request: ExportTraceServiceRequest, *, integer_enums: bool = False) -> dict[str, Any]:
    """OTLP/JSON of a request: protobuf's JSON mapping with the ids turned from base64 into hex, as the spec says."""
    doc: dict[str, Any] = MessageToDict(request, use_integers_for_enums=integer_enums)
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return doc


def json_body(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def span_doc(**overrides: Any) -> dict[str, Any]:
    span = {
        "traceId": "5b8efff798038103d269b633813fc60c",
        "spanId": "eee19b7ec3c1b174",
        "name": "s",
        "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000001000000000",
    }
    span.update(overrides)
    return {"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}


def expected(span: ReadableSpan) -> dict[str, Any]:
    ctx = span.get_span_context()
    assert ctx is not None and span.start_time is not None and span.end_time is not None
    return {
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
        "name": span.name,
        "start_time": span.start_time / 1e9,
        "end_time": span.end_time / 1e9,
    }


def by_name(spans: list[SpanIn]) -> dict[str, SpanIn]:
    return {s.name: s for s in spans}


# ---------------------------------------------------------------------------------------------- parsing


@pytest.fixture(scope="module")
def request_pb() -> ExportTraceServiceRequest:
    return encode_spans(sdk_spans())


@pytest.mark.parametrize("encoding", ["protobuf", "json", "json-integer-enums"])
def test_sdk_spans_parse_alike_in_both_encodings(request_pb: ExportTraceServiceRequest, encoding: str) -> None:
    if encoding == "protobuf":
        spans = parse_otlp_traces(request_pb.SerializeToString(), PB)
    else:
        spans = parse_otlp_traces(json_body(to_otlp_json(request_pb, integer_enums=encoding.endswith("enums"))), JSON)
    assert len(spans) == 3
    for span in spans:
        SpanIn.model_validate(span.model_dump())  # built without validation: must still be a valid SpanIn
    got = by_name(spans)
    root, tool, handle = got["agent:writer"], got["tool:sql"], got["handle"]

    # ids and parent links
    assert len({s.trace_id for s in spans}) == 1
    assert root.parent_id is None
    assert tool.parent_id == root.span_id and handle.parent_id == root.span_id
    # kinds and statuses
    assert (root.kind, tool.kind, handle.kind) == ("internal", "client", "server")
    assert (root.status, tool.status, handle.status) == (SpanStatus.ok, SpanStatus.error, SpanStatus.unset)
    assert tool.status_message == "near 'SELEC': syntax error" and root.status_message is None
    # attributes of every type, as JSON values
    assert tool.attributes == {
        **SQL_ATTRIBUTES,
        "tags": ["a", "b"],
        "ints": [1, 2, 3],
        "floats": [0.5, 1.5],
        "bools": [True, False],
        "blob": base64.b64encode(b"\x00\xffagl").decode(),
        attr.ROLLOUT_ID: "ro-from-resource",
        "otel.scope.name": "agl.tests",
    }
    assert tool.events and tool.events[0]["name"] == "retry"
    assert tool.events[0]["attributes"] == {"attempt": 2, "why": "locked"}
    assert tool.start_time <= tool.events[0]["time"] <= tool.end_time  # type: ignore[operator]
    # agl's ids: the span's own attributes win, the resource's fill in
    assert (root.rollout_id, root.attempt_id, root.agent_name) == ("ro-1", "at-1", "writer")
    assert (tool.rollout_id, tool.attempt_id, tool.agent_name) == ("ro-from-resource", None, None)
    assert all(s.source == "otlp" for s in spans)


def test_encodings_give_identical_spans_and_times_match_the_sdk(request_pb: ExportTraceServiceRequest) -> None:
    from_pb = parse_otlp_traces(request_pb.SerializeToString(), PB)
    from_json = parse_otlp_traces(json_body(to_otlp_json(request_pb)), JSON)
    assert [s.model_dump() for s in from_pb] == [s.model_dump() for s in from_json]
    # the request's own ids and times, read back independently of the parser
    raw = request_pb.resource_spans[0].scope_spans[0].spans
    for pb_span, span in zip(raw, from_pb, strict=True):
        assert span.trace_id == pb_span.trace_id.hex() and span.span_id == pb_span.span_id.hex()
        assert span.parent_id == (pb_span.parent_span_id.hex() or None)
        assert span.start_time == pb_span.start_time_unix_nano / 1e9
        assert span.end_time == pb_span.end_time_unix_nano / 1e9


def test_ids_and_times_match_the_sdk_spans() -> None:
    spans = sdk_spans()
    parsed = by_name(parse_otlp_traces(encode_spans(spans).SerializeToString(), PB))
    for span in spans:
        got = parsed[span.name]
        assert got.model_dump(include=set(expected(span))) == expected(span)


def test_kvlist_bytes_and_empty_values_in_protobuf() -> None:
    request = encode_spans(sdk_spans())
    span = request.resource_spans[0].scope_spans[0].spans[0]
    kv = KeyValueList(
        values=[
            KeyValue(key="x", value=AnyValue(int_value=1)),
            KeyValue(key="y", value=AnyValue(bytes_value=b"\x01\x02")),
        ]
    )
    span.attributes.extend(
        [
            KeyValue(key="kv", value=AnyValue(kvlist_value=kv)),
            KeyValue(key="empty", value=AnyValue()),
            KeyValue(key="nan", value=AnyValue(double_value=math.nan)),
            KeyValue(key="inf", value=AnyValue(double_value=-math.inf)),
        ]
    )
    got = parse_otlp_traces(request.SerializeToString(), PB)[0].attributes
    assert got["kv"] == {"x": 1, "y": "AQI="}
    assert got["empty"] is None
    assert (got["nan"], got["inf"]) == ("NaN", "-Infinity")  # JSON has no NaN: kept as OTLP/JSON writes it


def test_hand_written_otlp_json_per_spec() -> None:
    """Numbers where strings are usual, legacy `instrumentationLibrarySpans`, upper-case hex, enum names."""
    body = {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [
                        {"key": "agl.rollout_id", "value": {"stringValue": "ro-9"}},
                        {"key": "agl.attempt_id", "value": {"stringValue": "at-9"}},
                        {"key": "agl.agent.name", "value": {"stringValue": "planner"}},
                    ]
                },
                "instrumentationLibrarySpans": [
                    {
                        "instrumentationLibrary": {"name": "old-lib"},
                        "spans": [
                            {
                                "traceId": "5B8EFFF798038103D269B633813FC60C",
                                "spanId": "EEE19B7EC3C1B174",
                                "parentSpanId": "",
                                "name": "",
                                "kind": "SPAN_KIND_PRODUCER",
                                "startTimeUnixNano": 1544712660000000000,
                                "endTimeUnixNano": "1544712661000000000",
                                "attributes": [
                                    {"key": "i", "value": {"intValue": 42}},
                                    {"key": "s", "value": {"intValue": "-5"}},
                                    {"key": "d", "value": {"doubleValue": "NaN"}},
                                    {"key": "d2", "value": {"doubleValue": 2}},
                                    {"key": "b", "value": {"boolValue": True}},
                                    {"key": "bytes", "value": {"bytesValue": "AQI="}},
                                    {
                                        "key": "arr",
                                        "value": {"arrayValue": {"values": [{"stringValue": "x"}, {"intValue": "1"}]}},
                                    },
                                    {
                                        "key": "kv",
                                        "value": {
                                            "kvlistValue": {"values": [{"key": "k", "value": {"boolValue": False}}]}
                                        },
                                    },
                                    {"key": "empty", "value": {}},
                                    {"key": "agl.agent.name", "value": {"stringValue": "critic"}},
                                ],
                                "events": [{"timeUnixNano": "1544712660500000000", "name": "ev"}],
                                "status": {"code": "STATUS_CODE_ERROR", "message": "boom"},
                                "unknownField": {"is": "ignored"},
                            }
                        ],
                    }
                ],
            }
        ],
    }
    [span] = parse_otlp_traces(json_body(body), JSON)
    SpanIn.model_validate(span.model_dump())
    assert span.trace_id == "5b8efff798038103d269b633813fc60c" and span.span_id == "eee19b7ec3c1b174"
    assert span.parent_id is None and span.name == "(unnamed)" and span.kind == "producer"
    assert (span.start_time, span.end_time) == (1544712660.0, 1544712661.0)
    assert span.attributes == {
        "i": 42,
        "s": -5,
        "d": "NaN",
        "d2": 2.0,
        "b": True,
        "bytes": "AQI=",
        "arr": ["x", 1],
        "kv": {"k": False},
        "empty": None,
        "agl.agent.name": "critic",
        "agl.rollout_id": "ro-9",
        "agl.attempt_id": "at-9",
        "otel.scope.name": "old-lib",
    }
    assert span.events == [{"name": "ev", "time": 1544712660.5, "attributes": {}}]
    assert (span.status, span.status_message) == (SpanStatus.error, "boom")
    assert (span.rollout_id, span.attempt_id, span.agent_name) == ("ro-9", "at-9", "critic")


def test_empty_requests_and_zero_parent() -> None:
    assert parse_otlp_traces(b"", PB) == []
    assert parse_otlp_traces(b"{}", JSON) == []
    assert parse_otlp_traces(json_body({"resourceSpans": [{"scopeSpans": [{}]}]}), JSON) == []
    [span] = parse_otlp_traces(json_body(span_doc(parentSpanId="0" * 16)), JSON)
    assert span.parent_id is None


def test_success_response() -> None:
    assert otlp_success_response(PB) == (b"", PB)  # an empty ExportTraceServiceResponse
    assert otlp_success_response(JSON) == (b"{}", JSON)


# -------------------------------------------------------------------------------------------- bad input

SPAN = "resourceSpans[0].scopeSpans[0].spans[0]"


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        (span_doc(traceId="xyz"), [f"{SPAN}.traceId", "32 hex", "'xyz'"]),
        (span_doc(traceId="W47/95gDgQPSabYzgT/GDA=="), [f"{SPAN}.traceId", "not base64"]),
        (span_doc(traceId="zz" * 16), [f"{SPAN}.traceId", "32 hex"]),
        (span_doc(traceId="0" * 32), [f"{SPAN}.traceId", "all-zero"]),
        (span_doc(spanId="0" * 16), [f"{SPAN}.spanId", "all-zero"]),
        (span_doc(spanId=None), [f"{SPAN}.spanId", "16 hex"]),
        (span_doc(parentSpanId="abc"), [f"{SPAN}.parentSpanId", "16 hex"]),
        (span_doc(endTimeUnixNano="1600000000000000000"), [f"{SPAN}.endTimeUnixNano", "before"]),
        (span_doc(startTimeUnixNano=None), [f"{SPAN}.startTimeUnixNano", "missing"]),
        (span_doc(startTimeUnixNano="soon"), [f"{SPAN}.startTimeUnixNano", "integer", "'soon'"]),
        (span_doc(kind="SPAN_KIND_WEIRD"), [f"{SPAN}.kind", "SPAN_KIND_WEIRD"]),
        (span_doc(kind=9), [f"{SPAN}.kind", "9"]),
        (span_doc(status={"code": 7}), [f"{SPAN}.status.code", "7"]),
        (span_doc(name=5), [f"{SPAN}.name", "string"]),
        (span_doc(attributes=[{"key": "k", "value": {"intValue": "x"}}]), [f"{SPAN}.attributes[0].value", "integer"]),
        (
            span_doc(attributes=[{"key": "k", "value": {"intValue": str(2**64)}}]),
            [f"{SPAN}.attributes[0].value", "int64"],
        ),
        (span_doc(attributes=[{"value": {"intValue": 1}}]), [f"{SPAN}.attributes[0].key"]),
        (span_doc(attributes={"k": "v"}), [f"{SPAN}.attributes", "array"]),
        (span_doc(events=[{"name": "e", "timeUnixNano": "x"}]), [f"{SPAN}.events[0].timeUnixNano"]),
        (
            {"resourceSpans": [{"scopeSpans": [{"spans": {"not": "a list"}}]}]},
            ["resourceSpans[0].scopeSpans[0].spans", "array"],
        ),
        ({"resourceSpans": [{"scopeSpans": [{"spans": ["x"]}]}]}, [SPAN, "span object"]),
        ({"resourceSpans": "x"}, ["resourceSpans", "array"]),
        (
            span_doc(
                attributes=[
                    {"key": "k", "value": {"kvlistValue": {"values": [{"key": "a", "value": {"boolValue": 1}}]}}}
                ]
            ),
            [f"{SPAN}.attributes[0].value.kvlistValue.values[0].value.boolValue", "true or false"],
        ),
        (
            {"resourceSpans": [{"resource": {"attributes": [{"key": 1}]}, "scopeSpans": []}]},
            ["resourceSpans[0].resource.attributes[0].key", "string"],
        ),
        ([1, 2], ["object", "resourceSpans"]),
    ],
)
def test_bad_json_names_the_field(doc: Any, words: list[str]) -> None:
    with pytest.raises(ValueError) as info:
        parse_otlp_traces(json_body(doc), JSON)
    for word in words:
        assert word in str(info.value), str(info.value)


def test_deeply_nested_values_are_refused() -> None:
    value: dict[str, Any] = {"stringValue": "leaf"}
    for _ in range(100):
        value = {"arrayValue": {"values": [value]}}
    with pytest.raises(
        ValueError, match=r"spans\[0\]\.attributes\[0\]\.value\.arrayValue\.values\[0\]\..*: values nested deeper"
    ):
        parse_otlp_traces(json_body(span_doc(attributes=[{"key": "k", "value": value}])), JSON)


@pytest.mark.parametrize("body", [b"{nope", b"", b"\xff\xfe"])
def test_invalid_json(body: bytes) -> None:
    with pytest.raises(ValueError, match="OTLP JSON body is not valid JSON"):
        parse_otlp_traces(body, JSON)


@pytest.mark.parametrize("body", [b"\x00garbage", b"\xff\xff\xff\xff", b"\x0a\x05ab"])
def test_garbage_protobuf(body: bytes) -> None:
    with pytest.raises(ValueError, match="OTLP protobuf body could not be parsed"):
        parse_otlp_traces(body, PB)


def _pb_with(**changes: Any) -> bytes:
    request = encode_spans(sdk_spans())
    span = request.resource_spans[0].scope_spans[0].spans[0]
    for key, value in changes.items():
        setattr(span, key, value)
    return bytes(request.SerializeToString())


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"trace_id": bytes(16)}, ["traceId", "all-zero"]),
        ({"span_id": bytes(8)}, ["spanId", "all-zero"]),
        ({"trace_id": b"\x01" * 15}, ["traceId", "16 bytes, got 15"]),
        ({"span_id": b"\x01" * 9}, ["spanId", "8 bytes, got 9"]),
        ({"parent_span_id": b"\x01" * 4}, ["parentSpanId", "8 bytes"]),
        ({"end_time_unix_nano": 1}, ["endTimeUnixNano", "before"]),
        ({"start_time_unix_nano": 0}, ["startTimeUnixNano", "missing"]),
        ({"kind": 17}, ["kind", "17"]),
    ],
)
def test_bad_protobuf_names_the_field(changes: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(ValueError) as info:
        parse_otlp_traces(_pb_with(**changes), PB)
    message = str(info.value)
    assert message.startswith(SPAN + "."), message
    for word in words:
        assert word in message, message


def test_unsupported_content_type() -> None:
    with pytest.raises(ValueError, match="content type"):
        parse_otlp_traces(b"{}", "text/plain")


# ------------------------------------------------------------------------------------------------- speed


def test_parsing_10k_protobuf_spans_is_fast() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("bench")
    with tracer.start_as_current_span("root"):
        for i in range(9_999):
            with tracer.start_as_current_span(
                "llm",
                attributes={
                    attr.ROLLOUT_ID: "ro-1",
                    attr.ATTEMPT_ID: "at-1",
                    attr.AGENT_NAME: "writer",
                    "n": i,
                    "x": 0.5,
                },
            ):
                pass
    body = encode_spans(exporter.get_finished_spans()).SerializeToString()
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        spans = parse_otlp_traces(body, PB)
        best = min(best, time.perf_counter() - start)
    assert len(spans) == 10_000
    assert best < 1.0, f"parsing 10,000 spans took {best:.3f} s"  # ~0.1 s on a laptop core; generous for CI


# ------------------------------------------------------------------------------------- the OTel helper


def _memory_provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(otel.AglAttributesProcessor())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def test_processor_tags_spans_with_the_current_rollout_and_agent() -> None:
    provider, exporter = _memory_provider()
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("outside"):
        pass
    token = set_rollout(RolloutContext(rollout_id="ro-7", attempt_id="at-7", server_url="http://x"))
    try:
        with tracer.start_as_current_span("in rollout"):
            pass
        with agent("writer"), tracer.start_as_current_span("in agent"):
            pass
        with tracer.start_as_current_span("explicit", attributes={attr.ROLLOUT_ID: "ro-mine"}):
            pass
    finally:
        reset_rollout(token)
    got = {s.name: dict(s.attributes or {}) for s in exporter.get_finished_spans()}
    assert got["outside"] == {}
    assert got["in rollout"] == {attr.ROLLOUT_ID: "ro-7", attr.ATTEMPT_ID: "at-7"}
    assert got["in agent"] == {attr.ROLLOUT_ID: "ro-7", attr.ATTEMPT_ID: "at-7", attr.AGENT_NAME: "writer"}
    assert got["explicit"] == {attr.ROLLOUT_ID: "ro-mine", attr.ATTEMPT_ID: "at-7"}  # set by the code: kept


def test_server_url_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGL_SERVER_URL", raising=False)
    with pytest.raises(ValueError, match="AGL_SERVER_URL"):
        otel.traces_endpoint()
    monkeypatch.setenv("AGL_SERVER_URL", "http://env:1/")
    assert otel.traces_endpoint() == "http://env:1/v1/traces"
    token = set_rollout(RolloutContext(rollout_id="r", attempt_id="a", server_url="http://ctx:2"))
    try:
        assert otel.traces_endpoint() == "http://ctx:2/v1/traces"
        assert otel.traces_endpoint("http://arg:3") == "http://arg:3/v1/traces"
    finally:
        reset_rollout(token)


def test_configure_otel_is_idempotent_per_url() -> None:
    try:
        first = otel.configure_otel("http://127.0.0.1:9", set_global=False)
        assert otel.configure_otel("http://127.0.0.1:9/", set_global=False) is first
        other = otel.configure_otel("http://127.0.0.1:10", set_global=False, batch=False)
        assert other is not first
        assert otel.force_flush(1000)
    finally:
        otel.shutdown_otel()
    assert otel.configure_otel("http://127.0.0.1:9", set_global=False) is not first
    otel.shutdown_otel()
    assert otel.force_flush(10)  # nothing configured: a no-op


def test_import_agl_does_not_load_the_otel_sdk() -> None:
    code = "import sys, agl; agl.span; assert 'opentelemetry.sdk' not in sys.modules, 'sdk loaded'"
    subprocess.run([sys.executable, "-c", code], check=True)


# ----------------------------------------------------------------------------- end to end, real server


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    srv = start_server(tmp_path / "run")
    yield srv
    srv.stop()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.url) as c:
        yield c


def claimed(server: ServerProcess, client: Client) -> tuple[str, str]:
    rollout = client.enqueue({"q": "1+1"})[0]
    resp = httpx.post(f"{server.url}{API}/claims", json={"worker_id": "test-worker"})
    resp.raise_for_status()
    [claim] = resp.json()
    assert claim["rollout"]["id"] == rollout.id
    return rollout.id, claim["attempt"]["id"]


def otlp_spans(client: Client, rollout_id: str) -> dict[str, Any]:
    return {s.name: s for s in client.rollout_detail(rollout_id).spans if s.source == "otlp"}


def test_sdk_exports_to_a_real_server(server: ServerProcess, client: Client) -> None:
    rollout_id, attempt_id = claimed(server, client)
    provider = otel.configure_otel(server.url, set_global=False, batch=True)
    tracer = provider.get_tracer("e2e")
    token = set_rollout(RolloutContext(rollout_id=rollout_id, attempt_id=attempt_id, server_url=server.url))
    try:
        with agent("writer"), tracer.start_as_current_span("plan") as plan:
            plan.set_attribute("step", 1)
            with tracer.start_as_current_span("tool:search", kind=SpanKind.CLIENT) as tool:
                tool.set_status(Status(StatusCode.ERROR, "timeout"))
    finally:
        reset_rollout(token)
    with tracer.start_as_current_span("explicit", attributes={attr.ROLLOUT_ID: rollout_id}):
        pass
    try:
        assert otel.force_flush(10_000)
        stored = otlp_spans(client, rollout_id)
    finally:
        otel.shutdown_otel()
    assert set(stored) == {"plan", "tool:search", "explicit"}
    plan_s, tool_s = stored["plan"], stored["tool:search"]
    assert tool_s.parent_id == plan_s.span_id and tool_s.trace_id == plan_s.trace_id
    assert plan_s.parent_id is None
    for s in (plan_s, tool_s):
        assert (s.rollout_id, s.attempt_id, s.agent_name) == (rollout_id, attempt_id, "writer")
    assert (tool_s.kind, tool_s.status, tool_s.status_message) == ("client", SpanStatus.error, "timeout")
    assert plan_s.attributes["step"] == 1 and plan_s.attributes["otel.scope.name"] == "e2e"
    assert (stored["explicit"].rollout_id, stored["explicit"].attempt_id) == (rollout_id, None)


def test_post_protobuf_json_and_gzip_directly(server: ServerProcess, client: Client) -> None:
    rollout_id, attempt_id = claimed(server, client)
    spans = sdk_spans()
    request = encode_spans(spans)
    # file the spans under this rollout and its running attempt (the server refuses spans naming any other)
    ids = {attr.ROLLOUT_ID: rollout_id, attr.ATTEMPT_ID: attempt_id}
    for rs in request.resource_spans:
        for kv in rs.resource.attributes:
            if kv.key in ids:
                kv.value.string_value = ids[kv.key]
    for span in request.resource_spans[0].scope_spans[0].spans:
        for kv in span.attributes:
            if kv.key in ids:
                kv.value.string_value = ids[kv.key]

    resp = httpx.post(f"{server.url}/v1/traces", content=request.SerializeToString(), headers={"content-type": PB})
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith(PB) and resp.content == b""
    assert set(otlp_spans(client, rollout_id)) == {"agent:writer", "tool:sql", "handle"}

    # the same spans again as JSON: re-sent spans are stored once
    resp = httpx.post(
        f"{server.url}/v1/traces", content=json_body(to_otlp_json(request)), headers={"content-type": JSON}
    )
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith(JSON) and resp.json() == {}
    assert len(client.rollout_detail(rollout_id).spans) == 3

    # a new span, gzipped JSON
    doc = span_doc(attributes=[{"key": attr.ROLLOUT_ID, "value": {"stringValue": rollout_id}}], name="zipped")
    resp = httpx.post(
        f"{server.url}/v1/traces",
        content=gzip.compress(json_body(doc)),
        headers={"content-type": JSON, "content-encoding": "gzip"},
    )
    assert resp.status_code == 200, resp.text
    stored = otlp_spans(client, rollout_id)
    assert set(stored) == {"agent:writer", "tool:sql", "handle", "zipped"}
    assert stored["tool:sql"].parent_id == stored["agent:writer"].span_id
    assert stored["tool:sql"].attributes["nested"] == SQL_ATTRIBUTES["nested"]


@pytest.mark.parametrize(
    ("body", "content_type", "words"),
    [
        (b"\x00garbage", PB, ["OTLP protobuf"]),
        (b"{nope", JSON, ["not valid JSON"]),
        (json_body(span_doc(traceId="xyz")), JSON, [f"{SPAN}.traceId", "32 hex"]),
        (json_body(span_doc(endTimeUnixNano="1")), JSON, [f"{SPAN}.endTimeUnixNano", "before"]),
    ],
)
def test_bad_bodies_get_400_with_the_reason(
    server: ServerProcess, client: Client, body: bytes, content_type: str, words: list[str]
) -> None:
    resp = httpx.post(f"{server.url}/v1/traces", content=body, headers={"content-type": content_type})
    assert resp.status_code == 400, resp.text
    message = resp.json()["error"]["message"]
    for word in words:
        assert word in message, message
    assert client.stats()["counts"]["spans"] == 0


def test_a_bad_span_refuses_the_whole_batch(server: ServerProcess, client: Client) -> None:
    good = copy.deepcopy(span_doc())["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    bad = dict(good, spanId="0" * 16)
    doc = {"resourceSpans": [{"scopeSpans": [{"spans": [good, bad]}]}]}
    resp = httpx.post(f"{server.url}/v1/traces", content=json_body(doc), headers={"content-type": JSON})
    assert resp.status_code == 400
    assert "resourceSpans[0].scopeSpans[0].spans[1].spanId" in resp.json()["error"]["message"]
    assert client.stats()["counts"]["spans"] == 0


def test_token_and_an_existing_provider(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that wants a token; the user's own provider keeps its exporter and also sends to agl."""
    server = start_server(tmp_path / "run", token="s3cret")
    try:
        with Client(server.url, token="s3cret") as client:
            rollout_id = client.enqueue({"q": 1})[0].id
            # no token: the exporter is refused (and says so in the log); nothing is stored
            refused = TracerProvider()
            otel.add_agl_processors(refused, server.url, batch=False)
            with refused.get_tracer("t").start_as_current_span("refused", attributes={attr.ROLLOUT_ID: rollout_id}):
                pass
            # the token from AGL_TOKEN, on a provider that has an exporter of its own
            monkeypatch.setenv("AGL_TOKEN", "s3cret")
            mine, memory = _memory_provider()
            otel.add_agl_processors(mine, server.url)
            with mine.get_tracer("t").start_as_current_span("mine", attributes={attr.ROLLOUT_ID: rollout_id}):
                pass
            assert otel.force_flush(10_000)
            assert [s.name for s in memory.get_finished_spans()] == ["mine"]
            assert set(otlp_spans(client, rollout_id)) == {"mine"}
            mine.shutdown()
            refused.shutdown()
    finally:
        server.stop()


GLOBAL_SCRIPT = """
import sys
from opentelemetry import trace
from agl.capture.tracing.otel import configure_otel, shutdown_otel
provider = configure_otel()  # AGL_SERVER_URL, made global, batched
assert configure_otel() is provider and trace.get_tracer_provider() is provider
with trace.get_tracer("global-test").start_as_current_span("via-global", attributes={"agl.rollout_id": sys.argv[1]}):
    pass
shutdown_otel()  # flushes the batch
"""


def test_global_provider_from_env_in_a_fresh_process(server: ServerProcess, client: Client) -> None:
    rollout_id = client.enqueue({"q": 1})[0].id
    env = {**os.environ, "AGL_SERVER_URL": server.url}
    subprocess.run([sys.executable, "-c", GLOBAL_SCRIPT, rollout_id], check=True, env=env, timeout=60)
    stored = otlp_spans(client, rollout_id)
    assert set(stored) == {"via-global"}
    assert stored["via-global"].attributes["otel.scope.name"] == "global-test"
