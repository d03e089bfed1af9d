"""Span ingestion over HTTP into the durable store, in batches: the REST route and the OTLP/HTTP receiver.

Target: ≥ 20,000 spans/s. Request bodies are built before the clock starts, so the figure is the server's
(parse, validate, commit to SQLite in WAL mode); the count in the store is checked afterwards. The spans belong
to a real rollout's running attempt, claimed first as a worker would: the server refuses spans that name none.

    python benchmarks/perf/bench_spans.py            # 60 batches of 1,000 per route
    python benchmarks/perf/bench_spans.py --smoke    # 3 batches of 100: that it runs, not how fast
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

from agl.client import Client
from agl.common.processes import start_server


def json_batches(n_batches: int, batch: int, rollout_id: str, attempt_id: str) -> list[bytes]:
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
                "rollout_id": rollout_id,
                "attempt_id": attempt_id,
                "agent_name": "bench",
            }
            for i in range(batch)
        ]
        bodies.append(orjson.dumps({"spans": spans}))
    return bodies


def otlp_batches(n_batches: int, batch: int, rollout_id: str, attempt_id: str) -> list[bytes]:
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
                    KeyValue(key="agl.rollout_id", value=AnyValue(string_value=rollout_id)),
                    KeyValue(key="agl.attempt_id", value=AnyValue(string_value=attempt_id)),
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


def running_attempt(url: str) -> tuple[str, str]:
    """A rollout and its running attempt, enqueued and claimed over HTTP as a worker does."""
    Client(url).enqueue({"question": "bench"})
    claim = {"worker_id": "bench", "max_rollouts": 1, "lease_s": 3600, "wait_s": 5}
    resp = httpx.post(f"{url}/api/v1/claims", json=claim, timeout=30)
    resp.raise_for_status()
    (claimed,) = resp.json()
    return claimed["rollout"]["id"], claimed["attempt"]["id"]


def main(n_batches: int = 60, batch: int = 1000, concurrency: int = 4) -> dict[str, object]:
    rows: dict[str, object] = {"batch size": batch, "batches per route": n_batches, "concurrent clients": concurrency}
    with tempfile.TemporaryDirectory(prefix="agl-bench-") as tmp:
        server = start_server(Path(tmp) / "run")
        try:
            ids = running_attempt(server.url)
            warm = json_batches(2, batch, *ids)
            asyncio.run(post_all(f"{server.url}/api/v1/spans", warm, "application/json", 1))
            for route, path, content_type, bodies in (
                ("REST JSON", "/api/v1/spans", "application/json", json_batches(n_batches, batch, *ids)),
                ("OTLP protobuf", "/v1/traces", "application/x-protobuf", otlp_batches(n_batches, batch, *ids)),
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


def smoke() -> None:
    """`make bench-smoke`: that this script runs, at a small size (the numbers are not judged)."""
    main(n_batches=3, batch=100)


if __name__ == "__main__":
    import sys

    smoke() if "--smoke" in sys.argv[1:] else main()
