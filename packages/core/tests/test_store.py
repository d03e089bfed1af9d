"""The durable store: rollout life cycle, leases, idempotent reports, group commit and reopening."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
from factories import downgrade

from agl.schema import (
    Attribution,
    EnqueueRequest,
    LLMCall,
    RewardIn,
    RolloutStatus,
    SpanIn,
    TaskIn,
)
from agl.store import ConflictError, NotFoundError, Store


def enqueue(store: Store, n: int = 1, **kw: object) -> list[str]:
    rollouts = store.enqueue(EnqueueRequest(task=TaskIn(input={"q": "1+1"}), n=n, **kw)).result()
    return [r.id for r in rollouts]


def call(rollout_id: str, attempt_id: str, seq: int) -> LLMCall:
    return LLMCall(
        id=f"llm-{attempt_id}-{seq}",
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        seq=seq,
        agent_name="a",
        attribution=Attribution.scope,
        trace_id=None,
        parent_span_id=None,
        model_requested="m",
        model="m",
        model_version=None,
        request={"messages": []},
        response_message={"role": "assistant", "content": "x"},
        prompt_ids=[1, 2],
        response_ids=[3],
        logprobs=[-0.1],
        finish_reason="stop",
        stream=False,
        status="ok",
        http_status=200,
        error=None,
        started_at=time.time(),
        latency_s=0.01,
        usage={},
        trainable=True,
        not_trainable_reason=None,
    )


def test_evaluation_rollouts_are_claimed_before_training_ones_queued_earlier(store: Store) -> None:
    # the training rollouts of the next steps, queued first, as with --max-staleness ≥ 1
    train = enqueue(store, n=3, mode="train", step=2)
    evaluation = enqueue(store, n=2, mode="eval", step=1)
    first = store.claim("w", 3, 30).result()
    assert [c.rollout.id for c in first] == [*evaluation, train[0]]
    assert [c.rollout.id for c in store.claim("w", 10, 30).result()] == train[1:]


def test_life_cycle_and_final_reward(store: Store) -> None:
    ids = enqueue(store, n=3)
    claims = store.claim("w", 10, 30).result()
    assert [c.rollout.id for c in claims] == ids  # FIFO
    assert all(c.rollout.status is RolloutStatus.running and c.attempt.number == 1 for c in claims)
    # returned float wins
    r0 = store.complete(claims[0].attempt.id, "succeeded", reward=0.75).result()
    assert (
        r0.status is RolloutStatus.succeeded and r0.final_reward == 0.75 and r0.final_attempt_id == claims[0].attempt.id
    )
    # no returned float: the last explicit reward of the final attempt
    a1 = claims[1].attempt
    store.add_rewards(
        [
            RewardIn(rollout_id=ids[1], attempt_id=a1.id, value=0.1, name="step", timestamp=1.0),
            RewardIn(rollout_id=ids[1], attempt_id=a1.id, value=0.9, name="end", timestamp=2.0),
        ]
    ).result()
    assert store.complete(a1.id, "succeeded").result().final_reward == 0.9
    # no reward at all stays None, never 0
    assert store.complete(claims[2].attempt.id, "succeeded").result().final_reward is None
    assert store.rewards(ids[0])[0].source.value == "returned"


def test_complete_is_idempotent_and_rejects_superseded(store: Store) -> None:
    (rid,) = enqueue(store, max_attempts=3)
    first = store.claim("w1", 1, 0.05).result()[0].attempt
    time.sleep(0.1)
    assert store.expire_leases(grace_s=0).result() == 1
    second = store.claim("w2", 1, 30).result()[0].attempt
    assert second.number == 2
    with pytest.raises(ConflictError, match="discarded"):
        store.complete(first.id, "succeeded", reward=1.0).result()
    store.complete(second.id, "succeeded", reward=0.5).result()
    again = store.complete(second.id, "succeeded", reward=0.5).result()
    assert again.final_reward == 0.5
    assert len(store.rewards(rid)) == 1  # the repeated report added nothing


def test_late_report_accepted_while_nobody_else_has_the_rollout(store: Store) -> None:
    (rid,) = enqueue(store)
    att = store.claim("w1", 1, 0.05).result()[0].attempt
    time.sleep(0.1)
    store.expire_leases(grace_s=0).result()
    assert store.get_rollout(rid).status is RolloutStatus.queued
    rollout = store.complete(att.id, "succeeded", reward=1.0).result()
    assert rollout.status is RolloutStatus.succeeded and rollout.final_attempt_id == att.id
    assert store.claim("w2", 1, 30).result() == []  # the retry was not handed out afterwards


def test_failures_retry_up_to_max_attempts(store: Store) -> None:
    (rid,) = enqueue(store, max_attempts=2)
    a1 = store.claim("w", 1, 30).result()[0].attempt
    assert store.complete(a1.id, "failed", error="boom").result().status is RolloutStatus.queued
    a2 = store.claim("w", 1, 30).result()[0].attempt
    final = store.complete(a2.id, "failed", error="boom again").result()
    assert final.status is RolloutStatus.failed
    assert "boom again" in (final.error or "") and "attempt 2 of 2" in (final.error or "")
    assert [a.status.value for a in store.attempts(rid)] == ["failed", "failed"]


def test_timeout_is_enforced_by_the_server(store: Store) -> None:
    (rid,) = enqueue(store, timeout_s=0.05, max_attempts=1)
    store.claim("w", 1, 30).result()
    time.sleep(0.1)
    assert store.expire_leases(grace_s=0).result() == 1
    rollout = store.get_rollout(rid)
    assert rollout.status is RolloutStatus.failed and "timeout" in (rollout.error or "")
    assert store.attempts(rid)[0].status.value == "timeout"


def test_heartbeat_extends_lease_and_refuses_dead_attempts(store: Store) -> None:
    enqueue(store)
    att = store.claim("w", 1, 0.2).result()[0].attempt
    extended = store.heartbeat(att.id, 60).result()
    assert extended.lease_expires_at > att.lease_expires_at + 50
    store.complete(att.id, "succeeded").result()
    with pytest.raises(ConflictError, match="not running"):
        store.heartbeat(att.id, 60).result()
    with pytest.raises(NotFoundError):
        store.heartbeat("at-nope", 60).result()


def test_reopen_resumes_queued_and_retries_expired(tmp_path: Path) -> None:
    s = Store(tmp_path)
    queued = enqueue(s, n=2)
    running = s.claim("w", 1, 0.05).result()[0]
    s.add_llm_call(call(running.rollout.id, running.attempt.id, s.next_llm_seq(running.attempt.id))).result()
    s.close()
    time.sleep(0.1)
    s2 = Store(tmp_path)
    try:
        assert s2.get_rollout(queued[1]).status is RolloutStatus.queued
        assert s2.expire_leases(grace_s=0).result() == 1
        assert s2.get_rollout(running.rollout.id).status is RolloutStatus.queued
        assert s2.next_llm_seq(running.attempt.id) == 1  # numbering continues after a restart
    finally:
        s2.close()


def test_one_failing_write_does_not_roll_back_its_batch(store: Store) -> None:
    enqueue(store)

    def bad(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO tasks(id, input, metadata, created_at) VALUES ('t-bad', '1', '{}', 0)")
        raise RuntimeError("bad write")

    # Queue several writes at once so they share one transaction.
    futures = [store.add_task(TaskIn(input=i)) for i in range(5)]
    bad_future = store.submit(bad)
    futures += [store.add_task(TaskIn(input=i)) for i in range(5, 10)]
    assert len({f.result().id for f in futures}) == 10
    with pytest.raises(RuntimeError, match="bad write"):
        bad_future.result()
    with pytest.raises(NotFoundError):
        store.get_task("t-bad")


def test_failing_llm_call_insert_keeps_the_rest_of_its_batch(store: Store) -> None:
    (rid,) = enqueue(store)
    (claim,) = store.claim("w", 1, 60).result()
    aid = claim.attempt.id
    # A duplicate id fails inside the same transaction as its neighbours (LLM call inserts use no savepoint).
    futures = [store.add_llm_call(call(rid, aid, 0)), store.add_llm_call(call(rid, aid, 0))]
    futures += [store.add_llm_call(call(rid, aid, seq)) for seq in (1, 2)]
    assert futures[0].result() is None
    with pytest.raises(sqlite3.IntegrityError):
        futures[1].result()
    for f in futures[2:]:
        f.result()
    assert [c.seq for c in store.llm_calls(rid)] == [0, 1, 2]


def test_resent_spans_and_rewards_are_stored_once(store: Store) -> None:
    (rid,) = enqueue(store)
    att = store.claim("w", 1, 30).result()[0].attempt
    span = SpanIn(
        trace_id="a" * 32, span_id="b" * 16, name="s", start_time=1, end_time=2, rollout_id=rid, attempt_id=att.id
    )
    assert store.add_spans([span]).result() == 1
    assert store.add_spans([span]).result() == 0
    reward = RewardIn(rollout_id=rid, attempt_id=att.id, value=1.0, uid="u1")
    store.add_rewards([reward]).result()
    store.add_rewards([reward]).result()
    assert len(store.spans(rid)) == 1 and len(store.rewards(rid)) == 1


def test_reward_for_unknown_attempt_is_refused(store: Store) -> None:
    (rid,) = enqueue(store)
    with pytest.raises(NotFoundError, match="at-missing"):
        store.add_rewards([RewardIn(rollout_id=rid, attempt_id="at-missing", value=1.0)]).result()


def test_task_ids_are_idempotent_but_not_overwritten(store: Store) -> None:
    store.add_task(TaskIn(id="t1", input={"a": 1})).result()
    assert store.add_task(TaskIn(id="t1", input={"a": 1})).result().id == "t1"
    with pytest.raises(ConflictError, match="different input"):
        store.add_task(TaskIn(id="t1", input={"a": 2})).result()
    assert store.get_task("t1").input == {"a": 1}


def test_final_llm_calls_come_from_the_final_attempt_only(store: Store) -> None:
    (rid,) = enqueue(store)
    lost = store.claim("w1", 1, 0.05).result()[0].attempt
    store.add_llm_call(call(rid, lost.id, store.next_llm_seq(lost.id))).result()
    time.sleep(0.1)
    store.expire_leases(grace_s=0).result()
    final = store.claim("w2", 1, 30).result()[0].attempt
    for _ in range(2):
        store.add_llm_call(call(rid, final.id, store.next_llm_seq(final.id))).result()
    store.complete(final.id, "succeeded", reward=1.0).result()
    rows = list(store.iter_final_llm_calls())
    assert [(c.attempt_id, c.seq) for _, c in rows] == [(final.id, 0), (final.id, 1)]
    assert len(store.llm_calls(rid)) == 3  # the lost attempt's call is kept as history


def test_bulk_rollout_details_match_the_one_by_one_read(store: Store) -> None:
    ids = enqueue(store, n=3)
    claims = store.claim("w", 3, 60).result()
    for claim in claims:
        store.add_llm_call(call(claim.rollout.id, claim.attempt.id, 0)).result()
        store.add_rewards([RewardIn(rollout_id=claim.rollout.id, attempt_id=claim.attempt.id, value=0.5)]).result()
    store.complete(claims[0].attempt.id, "succeeded", reward=1.0).result()
    bulk = store.rollout_details([*ids, "ro-missing"])
    assert [d.rollout.id for d in bulk] == ids
    for d in bulk:
        assert d.model_dump() == store.rollout_detail(d.rollout.id).model_dump()


def test_a_store_from_the_previous_schema_is_migrated_in_place_keeping_its_data(tmp_path: Path) -> None:
    from agl.schema import ModelVersionIn
    from agl.store.schema import SCHEMA_VERSION

    s = Store(tmp_path)
    (rollout_id,) = enqueue(s)
    (claim,) = s.claim("w", 1, 30).result()
    s.add_llm_call(call(rollout_id, claim.attempt.id, 0)).result()
    s.publish_model_version(ModelVersionIn(name="step-1", upstream_model="base")).result()
    s.close()
    # make it look like a store written by schema 1 (no per-agent models, no sampling temperature, agent key or
    # prompt base)
    db = sqlite3.connect(tmp_path / "agl.sqlite")
    downgrade(db, to=1)
    db.commit()
    db.close()

    s = Store(tmp_path)
    try:
        assert s.get_rollout(rollout_id).status is RolloutStatus.running
        old = s.latest_model_version()
        assert old is not None and old.name == "step-1" and old.agent_models == {}
        s.publish_model_version(ModelVersionIn(name="step-2", agent_models={"writer": "lora-writer"})).result()
        new = s.latest_model_version()
        assert new is not None and new.agent_models == {"writer": "lora-writer"} and new.version == old.version + 1
        # the old call reads back without a temperature; a new one keeps its own
        s.add_llm_call(call(rollout_id, claim.attempt.id, 1).model_copy(update={"temperature": 0.7})).result()
        assert [(c.seq, c.temperature) for c in s.llm_calls(rollout_id)] == [(0, None), (1, 0.7)]
        assert [c.route for c in s.llm_calls(rollout_id)] == ["chat", "chat"]  # calls from before schema 8: chat
    finally:
        s.close()
    db = sqlite3.connect(tmp_path / "agl.sqlite")
    assert db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == str(SCHEMA_VERSION)
    db.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION + 1),))
    db.commit()
    db.close()
    with pytest.raises(RuntimeError, match="newer than this agl"):
        Store(tmp_path)
