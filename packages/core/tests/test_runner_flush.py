"""The runner's span batches and the attempt's report, against a real `agl serve`: a batch that a heartbeat took
while the agent ran, and that is still on its way when the agent returns, is stored before the attempt is reported.
The server refuses spans of an attempt that has already reported, so the report must wait for it (AutoGen's
streaming tests lost every span of a rollout so on a loaded CI machine).

The batch is held back by wrapping the client's `add_spans` with a delay: that makes the race certain instead of
a matter of load."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import agl
from agl.client import AsyncClient, Client
from agl.common.processes import ServerProcess

HEARTBEAT_S = 0.2
HELD_S = 1.5  # the heartbeat's batch arrives this long after it was taken: well after the agent returned


def test_a_heartbeats_batch_in_flight_is_stored_before_the_attempt_reports(
    agl_server: ServerProcess, agl_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[list[str]] = []
    add_spans = AsyncClient.add_spans

    async def held_add_spans(self: AsyncClient, spans: Any) -> int:
        sent.append([s.name for s in spans])
        if len(sent) == 1:
            await asyncio.sleep(HELD_S)
        return await add_spans(self, spans)

    monkeypatch.setattr(AsyncClient, "add_spans", held_add_spans)

    @agl.rollout
    async def agent(task: Any, llm: agl.LLM) -> float:
        with agl.span("early"):
            pass
        await asyncio.sleep(4 * HEARTBEAT_S)  # a heartbeat takes "early" meanwhile
        with agl.span("late"):
            pass
        return 1.0

    (rollout,) = agl_client.enqueue("t")
    stats = agl.Runner(agent, agl_server.url, concurrency=1, heartbeat_s=HEARTBEAT_S).run(max_rollouts=1)
    assert stats.succeeded == 1, stats
    assert sent[0] == ["early"] and sent[1] == ["late"]  # the heartbeat's batch, then the final one
    detail = agl_client.rollout_detail(rollout.id)
    assert detail.rollout.status.value == "succeeded"
    assert sorted(s.name for s in detail.spans) == ["early", "late"]
