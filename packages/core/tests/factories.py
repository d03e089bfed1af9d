"""Stored-record factories for unit tests: rollouts for transitions and credit assignment, calls for the store."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from agl.common import attributes as attr
from agl.schema import (
    Attempt,
    AttemptStatus,
    Attribution,
    EnqueueRequest,
    LLMCall,
    Reward,
    RewardIn,
    RewardSource,
    Rollout,
    RolloutDetail,
    RolloutStatus,
    Span,
    SpanIn,
    SpanStatus,
    Task,
    TaskIn,
)
from agl.store import Store

_ids = itertools.count()


@dataclass
class Call:
    prompt: list[int]
    response: list[int]
    agent: str | None = "solver"
    logprobs: list[float] | None = None
    trainable: bool = True
    status: str = "ok"
    model_version: int | None = None
    tool_calls: tuple[tuple[str, str], ...] = ()  # (id, tool name) the answer asked for


@dataclass
class Rew:
    value: float
    after_seq: int | None
    source: RewardSource = RewardSource.explicit


@dataclass
class ToolSpan:
    name: str
    status: SpanStatus
    after_seq: int | None  # recorded as agl.after_llm_seq; None: only times (as from another tracer)
    start_time: float = 0.0
    attributes: dict[str, Any] = field(default_factory=dict)  # more span attributes (a call id, an ordinal)
    agent: str | None = None


@dataclass
class Run:
    task_id: str
    calls: list[Call]
    rewards: list[Rew] = field(default_factory=list)
    final: float | None = 1.0
    status: RolloutStatus = RolloutStatus.succeeded
    tools: list[ToolSpan] = field(default_factory=list)


def detail(run: Run) -> RolloutDetail:
    n = next(_ids)
    rollout_id, attempt_id = f"ro-{n}", f"at-{n}"
    rollout = Rollout(
        id=rollout_id,
        task_id=run.task_id,
        mode="train",
        step=None,
        status=run.status,
        attempt_count=1,
        max_attempts=1,
        timeout_s=None,
        created_at=0.0,
        started_at=0.0,
        ended_at=1.0,
        final_attempt_id=attempt_id if run.status is RolloutStatus.succeeded else None,
        final_reward=run.final,
        error=None,
        metadata={},
    )
    attempt = Attempt(
        id=attempt_id,
        rollout_id=rollout_id,
        number=1,
        worker_id="w",
        status=AttemptStatus.succeeded,
        started_at=0.0,
        heartbeat_at=0.0,
        lease_expires_at=1.0,
        ended_at=1.0,
        error=None,
    )
    calls = [
        LLMCall(
            id=f"llm-{n}-{seq}",
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            seq=seq,
            agent_name=c.agent,
            attribution=Attribution.scope if c.agent else Attribution.unattributed,
            trace_id=None,
            parent_span_id=None,
            model_requested="m",
            model="m",
            model_version=c.model_version,
            request={"messages": []},
            response_message={
                "role": "assistant",
                "tool_calls": [{"id": i, "type": "function", "function": {"name": t}} for i, t in c.tool_calls],
            }
            if c.tool_calls
            else None,
            prompt_ids=c.prompt if c.trainable else None,
            response_ids=c.response if c.trainable else None,
            logprobs=c.logprobs if c.logprobs is not None else [-0.5] * len(c.response),
            finish_reason="stop",
            stream=False,
            status=c.status,
            http_status=200,
            error=None,
            started_at=float(seq),
            latency_s=0.5,
            usage={},
            trainable=c.trainable,
            not_trainable_reason=None if c.trainable else "the backend returned no token ids",
        )
        for seq, c in enumerate(run.calls)
    ]
    rewards = [
        Reward(
            id=i,
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            value=r.value,
            name=f"r{i}",
            source=r.source,
            after_llm_seq=r.after_seq,
            timestamp=0.0,
        )
        for i, r in enumerate(run.rewards)
    ]
    if run.final is not None:
        rewards.append(
            Reward(
                id=len(rewards),
                rollout_id=rollout_id,
                attempt_id=attempt_id,
                value=run.final,
                name="final",
                source=RewardSource.returned,
                after_llm_seq=len(run.calls) - 1 if run.calls else None,
                timestamp=0.0,
            )
        )
    spans = [
        Span(
            trace_id="a" * 32,
            span_id=f"{n:08x}{i:08x}",
            name=f"tool:{t.name}",
            start_time=t.start_time,
            end_time=t.start_time + 0.1,
            status=t.status,
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            attributes={
                "agl.span.kind": "tool",
                "gen_ai.tool.name": t.name,
                **({"agl.after_llm_seq": t.after_seq} if t.after_seq is not None else {}),
                **t.attributes,
            },
            agent_name=t.agent,
        )
        for i, t in enumerate(run.tools)
    ]
    task = Task(id=run.task_id, input="q", metadata={}, created_at=0.0)
    return RolloutDetail(rollout=rollout, task=task, attempts=[attempt], spans=spans, llm_calls=calls, rewards=rewards)


def attempt(store: Store, max_attempts: int = 1) -> tuple[str, str]:
    """(rollout id, attempt id) of a new rollout's running attempt."""
    (rollout,) = store.enqueue(EnqueueRequest(task=TaskIn(input="x"), max_attempts=max_attempts)).result()
    (claim,) = store.claim("w", 1, 60).result()
    return rollout.id, claim.attempt.id


def llm_call(
    rollout_id: str, attempt_id: str, seq: int, prompt: list[int] | None, response: list[int] | None, **kw: Any
) -> LLMCall:
    """A call as the proxy hands it to the store (`Store.add_llm_call`); `kw` overrides any field."""
    values: dict[str, Any] = {
        "id": f"llm-{attempt_id}-{seq}",
        "rollout_id": rollout_id,
        "attempt_id": attempt_id,
        "seq": seq,
        "agent_name": "solver",
        "attribution": Attribution.scope,
        "trace_id": None,
        "parent_span_id": None,
        "model_requested": "m",
        "model": "m",
        "model_version": 3,
        "request": {"messages": [{"role": "user", "content": "q"}]},
        "response_message": {"role": "assistant", "content": f"answer {seq}"},
        "prompt_ids": prompt,
        "response_ids": response,
        "logprobs": None if response is None else [-0.5 - i / 8 for i in range(len(response))],
        "finish_reason": "stop",
        "stream": False,
        "status": "ok",
        "http_status": 200,
        "error": None,
        "started_at": 100.0 + seq,
        "latency_s": 0.5,
        "usage": {},
        "trainable": True,
        "not_trainable_reason": None,
        "temperature": 0.7,
        "agent_key": None,
    }
    values.update(kw)
    return LLMCall(**values)


def downgrade(db: Any, to: int) -> None:
    """Make a store look as schema `to` left it: drop every column a later migration adds (read from the
    migrations themselves, so a new one needs no change here) and the indexes made after them, and set its
    version. Tables a migration creates are the caller's to drop."""
    import re

    from agl.store.schema import INDEXES, MIGRATIONS, SCHEMA_VERSION

    for name in re.findall(r"CREATE INDEX IF NOT EXISTS (\w+)", INDEXES):
        db.execute(f"DROP INDEX {name}")
    for version in range(SCHEMA_VERSION - 1, to - 1, -1):
        for statement in reversed(MIGRATIONS[version]):
            added = re.match(r"ALTER TABLE (\w+) ADD COLUMN (\w+)", statement)
            if added:
                db.execute(f"ALTER TABLE {added.group(1)} DROP COLUMN {added.group(2)}")
    db.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(to),))


def _tool_span(rollout_id: str, attempt_id: str, n: int, status: SpanStatus, after_seq: int) -> SpanIn:
    return SpanIn(
        trace_id=f"{n:032x}",
        span_id=f"{n:016x}",
        name="tool calculator",
        start_time=100.0 + after_seq + 0.6,
        end_time=100.0 + after_seq + 0.7,
        attributes={attr.SPAN_KIND: "tool", attr.TOOL_NAME: "calculator", attr.AFTER_LLM_SEQ: after_seq},
        status=status,
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        agent_name="solver",
    )


def fill_training_cases(store: Store) -> list[str]:
    """Rollouts for the training read: two tasks × 2 rollouts, each retried once: the first attempt's calls, spans and rewards must not count.
    Multi-turn chats (a prompt that extends the previous call), two agents, an unattributed call, a failed call,
    a call without ids, and one rollout that failed for good."""
    ids: list[str] = []
    span_no = iter(range(1, 10_000))
    for task in range(2):
        rollouts = store.enqueue(EnqueueRequest(task=TaskIn(input={"q": task}), n=2, max_attempts=2)).result()
        ids += [r.id for r in rollouts]
        for first in store.claim("w", 2, 60).result():
            a = first.attempt
            store.add_llm_call(llm_call(first.rollout.id, a.id, 0, [1, 2, 3], [4, 5])).result()
            store.add_spans([_tool_span(first.rollout.id, a.id, next(span_no), SpanStatus.error, 0)]).result()
            store.add_rewards(
                [RewardIn(rollout_id=first.rollout.id, attempt_id=a.id, value=9.0, after_llm_seq=0)]
            ).result()
            store.complete(a.id, "failed", error="boom").result()
        for k, claim in enumerate(store.claim("w", 2, 60).result()):
            rid, aid = claim.rollout.id, claim.attempt.id
            prompt = [7, 8, 9, 10 + task]
            calls = [
                llm_call(rid, aid, 0, prompt, [20 + k, 21]),
                llm_call(rid, aid, 1, [*prompt, 20 + k, 21, 30], [31 + k], agent_name="checker", agent_key="check"),
                llm_call(rid, aid, 2, [*prompt, 20 + k, 21, 30, 31 + k, 40], [41, 42, 43]),
                llm_call(rid, aid, 3, [5, 6], [7], agent_name=None, attribution=Attribution.unattributed),
                llm_call(rid, aid, 4, [5, 6], [8], status="error", http_status=500, logprobs=None),
                llm_call(rid, aid, 5, None, None, trainable=False, not_trainable_reason="the backend sent no ids"),
            ]
            if k == 1:
                calls.append(llm_call(rid, aid, 6, [*prompt, 99], [100], response_message={"content": "12"}))
            for c in calls:
                store.add_llm_call(c).result()
            store.add_spans([_tool_span(rid, aid, next(span_no), SpanStatus.error, 1)]).result()
            store.add_rewards([RewardIn(rollout_id=rid, attempt_id=aid, value=0.25, name="ok", after_llm_seq=1)])
            if task == 1 and k == 1:
                store.complete(aid, "failed", error="for good").result()
            else:
                store.complete(aid, "succeeded", reward=float(k), after_llm_seq=len(calls) - 1).result()
    return ids
