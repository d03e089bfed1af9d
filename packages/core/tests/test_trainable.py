"""The training read (`Store.trainable_rollouts`, agl.trainable): the final attempt of each rollout with its token
ids packed, giving the same transitions, credit and AIR rewards as the full `RolloutDetail` read."""

from __future__ import annotations

import gc
import sqlite3
from array import array
from typing import Any

import pytest
from factories import llm_call

from agl.air import AnswerParseRule, ToolStatusRule, with_air
from agl.credit import assign_credit
from agl.schema import Attribution, EnqueueRequest, RewardIn, SpanIn, SpanStatus, TaskIn
from agl.selection import AgentSelection
from agl.store import Store
from agl.tracing import attributes as attr
from agl.trainable import TrainableRollout, from_wire, to_wire
from agl.transitions import Transition, build_episodes

RULES = (ToolStatusRule(error_reward=-0.3), AnswerParseRule(parse=lambda text: int(text)))


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


def _fill(store: Store) -> list[str]:
    """Two tasks × 2 rollouts, each retried once: the first attempt's calls, spans and rewards must not count.
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


def _as_lists(t: Transition) -> tuple[Any, ...]:
    return (
        t.rollout_id,
        t.task_id,
        t.attempt_id,
        t.seq,
        t.agent_name,
        list(t.prompt_ids),
        list(t.response_ids),
        list(t.response_mask),
        None if t.logprobs is None else list(t.logprobs),
        t.model_version,
        t.call_ids,
        t.reward,
        t.ret,
        t.advantage,
        t.weight,
        t.temperature,
    )


def test_it_holds_the_final_attempt_with_packed_ids(store: Store) -> None:
    ids = _fill(store)
    trainable = store.trainable_rollouts([*ids, "ro-unknown"])
    details = store.rollout_details(ids)
    assert [r.rollout.id for r in trainable] == ids  # in the order asked, unknown ids skipped
    for got, full in zip(trainable, details, strict=True):
        final = full.rollout.final_attempt_id
        assert got.rollout == full.rollout and got.task == full.task
        wanted = [c for c in full.llm_calls if c.attempt_id == final]
        assert [c.id for c in got.llm_calls] == [c.id for c in wanted]
        assert got.rewards == [r for r in full.rewards if r.attempt_id == final]
        assert got.spans == [s for s in full.spans if s.attempt_id == final]
        for mine, theirs in zip(got.llm_calls, wanted, strict=True):
            assert isinstance(mine.prompt_ids, array) or theirs.prompt_ids is None
            assert (mine.prompt_ids is None) == (theirs.prompt_ids is None)
            assert list(mine.prompt_ids or []) == (theirs.prompt_ids or [])
            assert list(mine.response_ids or []) == (theirs.response_ids or [])
            assert (None if mine.logprobs is None else list(mine.logprobs)) == theirs.logprobs
            assert mine.response_message == theirs.response_message
            for name in ("agent_name", "agent_key", "attribution", "status", "trainable", "seq", "temperature"):
                assert getattr(mine, name) == getattr(theirs, name), name
    # a rollout that failed for good still comes back (build_episodes counts it), with no final attempt's data
    (failed,) = [r for r in trainable if r.rollout.status.value == "failed"]
    assert failed.llm_calls == [] and failed.rewards == [] and failed.spans == []


@pytest.mark.parametrize("strategy", ["broadcast", "discounted", "grpo", "step"])
@pytest.mark.parametrize("merge", [False, True])
def test_same_transitions_credit_and_air_as_the_full_read(store: Store, strategy: str, merge: bool) -> None:
    ids = _fill(store)
    selection = AgentSelection.parse("solver,check")
    built = []
    for source in (store.trainable_rollouts(ids), store.rollout_details(ids)):
        with_rewards = [with_air(d, RULES) for d in source]
        episodes, stats = build_episodes(with_rewards, selection, merge_prefixes=merge, max_tokens=11)
        credit = assign_credit(episodes, strategy)
        built.append(([_as_lists(t) for e in episodes for t in e.transitions], stats, credit))
    (mine, my_stats, my_credit), (theirs, their_stats, their_credit) = built
    assert mine == theirs and my_stats == their_stats and my_credit == their_credit
    assert my_stats.transitions > 0 and my_stats.dropped_calls and my_stats.dropped_rollouts
    # AIR's tool rule placed its reward on the final attempt's call 1 (-0.3); the first attempts' never count
    assert any(t[11] == pytest.approx(0.25 - 0.3) for t in mine)
    assert all(t[11] != 9.0 for t in mine)


def test_the_wire_format_round_trips(store: Store) -> None:
    ids = _fill(store)
    trainable = store.trainable_rollouts(ids)
    back = from_wire(to_wire(trainable))
    assert len(back) == len(trainable)
    for a, b in zip(back, trainable, strict=True):
        assert (a.rollout, a.task, a.spans, a.rewards) == (b.rollout, b.task, b.spans, b.rewards)
        for x, y in zip(a.llm_calls, b.llm_calls, strict=True):
            assert (x.prompt_ids, x.response_ids, x.logprobs) == (y.prompt_ids, y.response_ids, y.logprobs)
            assert x.response_message == y.response_message and x.attribution is y.attribution
            assert (x.id, x.seq, x.agent_key, x.trainable, x.started_at) == (
                y.id,
                y.seq,
                y.agent_key,
                y.trainable,
                y.started_at,
            )
    # token ids travel as base64 of their bytes, never as JSON numbers
    assert b"[7,8,9" not in to_wire(trainable)


def test_ids_that_are_not_int32_make_a_call_untrainable_not_a_crash(store: Store) -> None:
    (rollout,) = store.enqueue(EnqueueRequest(task=TaskIn(input="x"))).result()
    (claim,) = store.claim("w", 1, 60).result()
    store.add_llm_call(llm_call(rollout.id, claim.attempt.id, 0, [1, 2**40], [3])).result()  # kept as JSON text
    store.add_llm_call(llm_call(rollout.id, claim.attempt.id, 1, [1, 2], [3])).result()
    store.complete(claim.attempt.id, "succeeded", reward=1.0).result()
    with sqlite3.connect(store.path) as conn:
        assert conn.execute("SELECT typeof(prompt_ids) FROM llm_calls WHERE seq=0").fetchone()[0] == "text"
    (got,) = store.trainable_rollouts([rollout.id])
    bad, good = got.llm_calls
    assert bad.prompt_ids is None and not bad.trainable and bad.not_trainable_reason == "token ids that are not int32"
    assert list(good.prompt_ids or []) == [1, 2]
    episodes, stats = build_episodes([got])
    assert len(episodes[0].transitions) == 1
    assert stats.dropped_calls == {"not trainable: token ids that are not int32": 1}


def test_air_rules_run_on_the_training_read(store: Store) -> None:
    ids = _fill(store)
    trainable = store.trainable_rollouts(ids)
    added = [with_air(d, RULES) for d in trainable]
    assert all(isinstance(d, TrainableRollout) for d in added)
    names = sorted({r.name for d in added for r in d.rewards})
    assert names == ["air:tool_status", "air:unparsable_answer", "final", "ok"]  # "final": the returned reward
    # the answer "12" parses: only the rollouts whose last solver answer is "answer N" get the parse penalty
    parse = [r for d in added for r in d.rewards if r.name == "air:unparsable_answer"]
    assert len(parse) == 2 and all(r.value == -0.5 for r in parse)


def test_a_bulk_read_leaves_the_cycle_collector_as_it_found_it(store: Store) -> None:
    ids = _fill(store)
    was = gc.isenabled()
    try:
        gc.enable()
        store.trainable_rollouts(ids)
        assert gc.isenabled()
        gc.disable()  # a caller that turned it off keeps it off
        store.trainable_rollouts(ids)
        assert not gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
