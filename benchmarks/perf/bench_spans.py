"""Span ingestion over HTTP into the durable store, in batches: the REST route and the OTLP/HTTP receiver.

Target: ≥ 20,000 spans/s. Request bodies are built before the clock starts, so the figure is the server's
(parse, validate, commit to SQLite in WAL mode); the count in the store is checked afterwards.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import tempfile
import time
from pathlib import Path

import httpx
import orjson
from _common import report

from agl.processes import start_server


def json_batches(n_batches: int, batch: int) -> list[bytes]:
    now = time.time()
    bodies = []
    for _ in range(n_batches):
        trace = secrets.token_hex(16)
        spans = [
            {
                "trace_id": trace,
                "span_id": secrets.token_hex(8),
                "parent_id": None,
                "name": f"tool:calc-{i % 7}",
                "start_time": now,
                "end_time": now + 0.01,
                "status": "ok",
                "attributes": {"agl.span.kind": "tool", "gen_ai.tool.name": "calc", "agl.tool.arguments": "1+2"},
                "rollout_id": "ro-bench",
                "attempt_id": "at-bench",
                "agent_name": "bench",
            }
            for i in range(batch)
        ]
        bodies.append(orjson.dumps({"spans": spans}))
    return bodies


def otlp_batches(n_batches: int, batch: int) -> list[bytes]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

    now = time.time_ns()
    bodies = []
    for _ in range(n_batches):
        trace = secrets.token_bytes(16)
        spans = [
            Span(
                trace_id=trace,
                span_id=secrets.token_bytes(8),
                name=f"llm-step-{i % 5}",
                kind=Span.SPAN_KIND_INTERNAL,
                start_time_unix_nano=now,
                end_time_unix_nano=now + 10_000_000,
                attributes=[
                    KeyValue(key="agl.rollout_id", value=AnyValue(string_value="ro-bench")),
                    KeyValue(key="agl.attempt_id", value=AnyValue(string_value="at-bench")),
                    KeyValue(key="step", value=AnyValue(int_value=i)),
                ],
                status=Status(code=Status.STATUS_CODE_OK),
            )
            for i in range(batch)
        ]
        req = ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=spans)])])
        bodies.append(req.SerializeToString())
    return bodies


async def post_all(url: str, bodies: list[bytes], content_type: str, concurrency: int) -> float:
    queue = list(bodies)
    async with httpx.AsyncClient(timeout=120) as client:

        async def pump() -> None:
            while queue:
                body = queue.pop()
                resp = await client.post(url, content=body, headers={"content-type": content_type})
                resp.raise_for_status()

        t0 = time.perf_counter()
        await asyncio.gather(*(pump() for _ in range(concurrency)))
        return time.perf_counter() - t0


def main(n_batches: int = 60, batch: int = 1000, concurrency: int = 4) -> dict[str, object]:
    rows: dict[str, object] = {"batch size": batch, "batches per route": n_batches, "concurrent clients": concurrency}
    with tempfile.TemporaryDirectory(prefix="agl-bench-") as tmp:
        server = start_server(Path(tmp) / "run")
        try:
            warm = json_batches(2, batch)
            asyncio.run(post_all(f"{server.url}/api/v1/spans", warm, "application/json", 1))
            for route, path, content_type, bodies in (
                ("REST JSON", "/api/v1/spans", "application/json", json_batches(n_batches, batch)),
                ("OTLP protobuf", "/v1/traces", "application/x-protobuf", otlp_batches(n_batches, batch)),
            ):
                elapsed = asyncio.run(post_all(server.url + path, bodies, content_type, concurrency))
                rows[f"{route}: spans/s"] = n_batches * batch / elapsed
            stored = httpx.get(f"{server.url}/api/v1/stats").json()["counts"]["spans"]
            rows["spans in the store"] = stored
            rows["all stored"] = stored == (2 + 2 * n_batches) * batch
            db = Path(tmp) / "run" / "agl.sqlite"
            rows["database size MB"] = round(os.path.getsize(db) / 1e6, 1)
        finally:
            server.stop()
    rows["target: spans/s ≥"] = 20_000
    rows["meets target"] = min(v for k, v in rows.items() if k.endswith("spans/s")) >= 20_000  # type: ignore[type-var]
    report("span_ingestion", rows)
    return rows


if __name__ == "__main__":
    main()
