"""A rollout's spans go to the server in batches within its limits (agl.client.span_bodies; the server states them
in GET /api/v1/info): one request of a rollout's 100,000 tool runs, or of 40 MB of spans, was refused whole (413)
and the rollout lost every span, and failed, though its agent returned 1.0. Against a real `agl serve`."""

from __future__ import annotations

import time
from typing import Any

import orjson

import agl
from agl.capture.tracing.spans import span
from agl.client import Client, span_bodies
from agl.common.processes import ServerProcess
from agl.schema import SpanIn

RUNS = 100_000


def test_bodies_stay_within_the_count_and_the_bytes() -> None:
    now = time.time()
    spans = [
        SpanIn(
            trace_id="a" * 32, span_id=f"{i:016x}", name="t", start_time=now, end_time=now, attributes={"x": "y" * 500}
        )
        for i in range(2_500)
    ]
    bodies = list(span_bodies(spans, 1_000, 300_000))
    assert all(len(b) <= 300_000 for b in bodies)
    decoded = [orjson.loads(b)["spans"] for b in bodies]
    assert all(len(d) <= 1_000 for d in decoded)
    assert [s["span_id"] for d in decoded for s in d] == [s.span_id for s in spans]  # all of them, in order
    assert len(list(span_bodies(spans, 1_000, 32 << 20))) == 3  # the count decides


def test_the_server_states_its_limits(agl_client: Client) -> None:
    info = agl_client.info()
    assert info["max_spans_per_request"] == 10_000 and info["max_body_bytes"] == 32 * 1024 * 1024


def test_a_rollout_of_100000_tool_runs_stores_them_all(agl_server: ServerProcess, agl_client: Client) -> None:
    @agl.rollout
    def agent(task: Any, llm: agl.LLM) -> float:
        # 100,000 tool spans of ~500 bytes: 10 times the spans and about twice the bytes one request may hold
        for i in range(RUNS):
            with span("bash", kind="tool", attributes={"command": f"echo {i} " + "x" * 400}):
                pass
        return 1.0

    (rollout,) = agl_client.enqueue("t")
    stats = agl.Runner(agent, agl_server.url, concurrency=1).run(max_rollouts=1)
    assert stats.succeeded == 1, stats
    detail = agl_client.rollout_detail(rollout.id)
    assert detail.rollout.status.value == "succeeded"
    assert sum(1 for s in detail.spans if s.name == "bash") == RUNS
