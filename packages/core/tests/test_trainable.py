"""The training read (`Store.trainable_rollouts`, agl.common.trainable): the final attempt of each rollout with its token
ids packed, giving the same transitions, credit and AIR rewards as the full `RolloutDetail` read."""

from __future__ import annotations

import gc
import sqlite3
from array import array
from typing import Any

import pytest
from factories import fill_training_cases, llm_call

from agl.common.trainable import TrainableRollout
from agl.learn.air import AnswerParseRule, ToolStatusRule, with_air
from agl.learn.credit import assign_credit
from agl.learn.selection import AgentSelection
from agl.learn.transitions import Transition, build_episodes
from agl.schema import EnqueueRequest, TaskIn
from agl.store import Store

RULES = (ToolStatusRule(error_reward=-0.3), AnswerParseRule(parse=lambda text: int(text)))


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
    ids = fill_training_cases(store)
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
    ids = fill_training_cases(store)
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
    ids = fill_training_cases(store)
    trainable = store.trainable_rollouts(ids)
    added = [with_air(d, RULES) for d in trainable]
    assert all(isinstance(d, TrainableRollout) for d in added)
    names = sorted({r.name for d in added for r in d.rewards})
    assert names == ["air:tool_status", "air:unparsable_answer", "final", "ok"]  # "final": the returned reward
    # the answer "12" parses: only the rollouts whose last solver answer is "answer N" get the parse penalty
    parse = [r for d in added for r in d.rewards if r.name == "air:unparsable_answer"]
    assert len(parse) == 2 and all(r.value == -0.5 for r in parse)


def test_a_bulk_read_leaves_the_cycle_collector_as_it_found_it(store: Store) -> None:
    ids = fill_training_cases(store)
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
