"""The work queue's routes: tasks, rollouts (enqueued, listed, read, cancelled), and what workers do with them
(claim, heartbeat, complete an attempt)."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from agl.common import attributes as attr
from agl.common.trainable_wire import encode as encode_trainable
from agl.schema import (
    INT64_MAX,
    Attempt,
    Claim,
    ClaimRequest,
    CompleteRequest,
    DetailsRequest,
    EnqueueRequest,
    HeartbeatRequest,
    Rollout,
    RolloutDetail,
    RolloutStatus,
    Task,
    TaskIn,
)
from agl.server.credentials import attempt_credential, llm_credential
from agl.server.relay import hung_up
from agl.server.reward_range import check_rewards
from agl.server.routes_server import API

if TYPE_CHECKING:
    from agl.server.context import ServerContext

log = logging.getLogger(__name__)


def add_routes(app: FastAPI, server: ServerContext) -> None:
    store = server.store

    @app.post(f"{API}/tasks", tags=["tasks"], status_code=201)
    async def add_task(task: TaskIn) -> Task:
        return await server.written(store.add_task(task))

    @app.get(f"{API}/tasks/{{task_id}}", tags=["tasks"])
    async def get_task(task_id: str) -> Task:
        return await run_in_threadpool(store.get_task, task_id)

    @app.post(f"{API}/rollouts", tags=["rollouts"], status_code=201)
    async def enqueue(req: EnqueueRequest) -> list[Rollout]:
        rollouts = await server.written(store.enqueue(req))
        server.wake_workers()
        return rollouts

    @app.get(f"{API}/rollouts", tags=["rollouts"])
    async def list_rollouts(
        status: RolloutStatus | None = None,
        step: int | None = Query(default=None, ge=0, le=INT64_MAX),
        ids: str | None = Query(default=None, description="comma-separated rollout ids", max_length=100_000),
        limit: int = Query(default=100, ge=1, le=10_000),
        offset: int = Query(default=0, ge=0, le=INT64_MAX),
    ) -> dict[str, Any]:
        if ids is not None:
            wanted = [i for i in ids.split(",") if i]
            items = await run_in_threadpool(store.get_rollouts, wanted)
            return {"items": items, "total": len(items)}
        items, total = await run_in_threadpool(
            lambda: store.list_rollouts(status=status.value if status else None, step=step, limit=limit, offset=offset)
        )
        return {"items": items, "total": total}

    @app.get(f"{API}/rollouts/{{rollout_id}}", tags=["rollouts"])
    async def get_rollout(rollout_id: str) -> Rollout:
        return await run_in_threadpool(store.get_rollout, rollout_id)

    @app.get(f"{API}/rollouts/{{rollout_id}}/detail", tags=["rollouts"])
    async def rollout_detail(rollout_id: str) -> RolloutDetail:
        return await run_in_threadpool(store.rollout_detail, rollout_id)

    @app.post(f"{API}/rollouts/details", tags=["rollouts"])
    async def rollout_details(req: DetailsRequest) -> list[RolloutDetail]:
        """Everything stored about many rollouts at once (the trainer's read); unknown ids are skipped."""
        return await run_in_threadpool(store.rollout_details, req.ids)

    @app.post(f"{API}/rollouts/trainable", tags=["rollouts"], response_class=Response)
    async def trainable_rollouts(req: DetailsRequest, request: Request) -> Response:
        """What training reads of many rollouts: each with the spans, LLM calls and rewards of its final
        attempt. Binary for a client whose `Accept` names `application/vnd.agl.trainable`, else JSON with
        token ids and log-probs as base64 of packed little-endian int32 / float64 (agl.common.trainable_wire)."""
        found = await run_in_threadpool(store.trainable_rollouts, req.ids)
        body, media_type = await run_in_threadpool(encode_trainable, found, request.headers.get("accept"))
        return Response(body, media_type=media_type)

    @app.post(f"{API}/rollouts/{{rollout_id}}/cancel", tags=["rollouts"])
    async def cancel(rollout_id: str) -> Rollout:
        return await server.written(store.cancel(rollout_id))

    @app.post(f"{API}/claims", tags=["workers"])
    async def claim(req: ClaimRequest, request: Request) -> list[Claim]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + req.wait_s
        # A worker that dies during its long poll must not be handed the next rollout: it would burn an
        # attempt and hold the rollout until the lease ran out. The wait ends when the worker hangs up.
        hangup = asyncio.ensure_future(hung_up(request)) if req.wait_s > 0 else None
        try:
            while True:
                event = server.work_event
                claims = await server.written(store.claim(req.worker_id, req.max_rollouts, req.lease_s))
                remaining = deadline - loop.time()
                if claims or remaining <= 0 or event is None:
                    if server.settings.token:
                        secret = server.settings.token
                        claims = [
                            c.model_copy(
                                update={
                                    "credential": attempt_credential(secret, c.attempt.id),
                                    "llm_credential": llm_credential(secret, c.attempt.id),
                                }
                            )
                            for c in claims
                        ]
                    return claims
                work = asyncio.ensure_future(event.wait())
                waits = {work} if hangup is None else {work, hangup}
                done, _ = await asyncio.wait(waits, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
                work.cancel()
                if hangup is not None and hangup in done:
                    log.info("worker %s hung up during its claim's wait: nothing claimed", req.worker_id)
                    return []
        finally:
            if hangup is not None:
                hangup.cancel()

    @app.post(f"{API}/attempts/{{attempt_id}}/heartbeat", tags=["workers"])
    async def heartbeat(attempt_id: str, req: HeartbeatRequest) -> Attempt:
        return await server.written(store.heartbeat(attempt_id, req.lease_s))

    @app.post(f"{API}/attempts/{{attempt_id}}/complete", tags=["workers"])
    async def complete(attempt_id: str, req: CompleteRequest, response: Response) -> Rollout:
        """Record the attempt's outcome once. The same report again is answered as the first was (200); one that
        disagrees with the first (another status, another reward) is refused with 409 and changes nothing."""
        if req.reward is not None:
            check_rewards([("the completion's reward", req.reward)], server.settings.max_abs_reward)
        rollout = await server.written(
            store.complete(
                attempt_id,
                req.status,
                reward=req.reward,
                error=req.error,
                after_llm_seq=req.after_llm_seq,
                agent_scopes=req.agent_scopes,
                elsewhere=(
                    None
                    if req.bypassed_llm_calls is None
                    else (
                        req.bypassed_llm_calls,
                        req.bypassed_llm_url,
                        req.external_llm_calls or 0,
                        req.bypassed_llm_answered,
                        req.bypassed_llm_refused,
                    )
                ),
            )
        )
        if rollout.status is RolloutStatus.queued:
            server.wake_workers()
        if req.agent_scopes:
            # tells the runner, which warns its user once: the count is the store's, not a guess
            response.headers[attr.HEADER_MISSED_ATTRIBUTION] = str(store.missed_attribution(attempt_id))
        if rollout.mode == "train" and (sampled := store.untrainable_sampling(rollout.id, attempt_id)):
            # the agent chose its own sampling (greedy, top-p) where the run does not own it: the runner says so
            response.headers[attr.HEADER_UNTRAINABLE_SAMPLING] = json.dumps(sampled, ensure_ascii=True)
        return rollout
