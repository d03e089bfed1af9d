"""A succeeded attempt's calls and rewards packed into one row for the training read (schema 7,
agl.store.attempt_packs): the read gives what the rows give, the pack follows whatever is added to the attempt
later, and attempts without a pack are read from their rows."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from factories import attempt, downgrade, llm_call

from agl.common.trainable import TrainableRollout
from agl.schema import Attribution, RewardIn, RewardSource
from agl.store import Store


def _packed(store: Store) -> set[str]:
    with sqlite3.connect(store.path) as conn:
        return {r[0] for r in conn.execute("SELECT attempt_id FROM attempt_packs")}


def _seen(found: list[TrainableRollout]) -> list[Any]:
    """Everything the training read gives, as plain values (arrays as lists)."""

    def plain(v: Any) -> Any:
        return list(v) if v is not None and not isinstance(v, str | int | float | bool | dict) else v

    out: list[Any] = []
    for r in found:
        calls = [
            [plain(getattr(c, f)) for f in c.__slots__ if f != "_message"] + [c.response_message] for c in r.llm_calls
        ]
        out.append(
            (r.rollout.model_dump(), [s.model_dump() for s in r.spans], calls, [w.model_dump() for w in r.rewards])
        )
    return out


def _from_rows(store: Store, rollout_ids: list[str]) -> list[Any]:
    """The training read with every pack set aside: what the calls' and rewards' own rows give."""
    with sqlite3.connect(store.path) as conn:
        conn.execute("ALTER TABLE attempt_packs RENAME TO set_aside")
        conn.execute("CREATE TABLE attempt_packs AS SELECT * FROM set_aside WHERE 0")
    try:
        return _seen(store.trainable_rollouts(rollout_ids))
    finally:
        with sqlite3.connect(store.path) as conn:
            conn.execute("DROP TABLE attempt_packs")
            conn.execute("ALTER TABLE set_aside RENAME TO attempt_packs")


def _chat(store: Store, rollout_id: str, attempt_id: str, rng: random.Random, turns: int, first: int = 0) -> None:
    prompt = [rng.randrange(50_000) for _ in range(50)]
    for seq in range(first, first + turns):
        response = [rng.randrange(50_000) for _ in range(8)]
        store.add_llm_call(llm_call(rollout_id, attempt_id, seq, prompt, response)).result()
        prompt = prompt + response + [rng.randrange(50_000) for _ in range(5)]


def test_the_read_of_packed_attempts_gives_what_their_rows_give(store: Store) -> None:
    rng = random.Random(3)
    ids, finals = [], []
    # a chat whose prompts are stored against earlier ones, with a call of no ids and one without log-probs
    rollout_id, attempt_id = attempt(store, max_attempts=2)
    _chat(store, rollout_id, attempt_id, rng, 4)
    store.add_llm_call(
        llm_call(rollout_id, attempt_id, 4, None, None, trainable=False, not_trainable_reason="no ids")
    ).result()
    store.add_llm_call(llm_call(rollout_id, attempt_id, 5, [1, 2, 3], [4, 5], logprobs=None, agent_key="k")).result()
    store.add_rewards(
        [
            RewardIn(
                rollout_id=rollout_id,
                attempt_id=attempt_id,
                value=0.25,
                name="tool",
                after_llm_seq=1,
                metadata={"tool": "calc", "n": [1, 2]},
            )
        ]
    ).result()
    store.complete(attempt_id, "succeeded", reward=1.0, after_llm_seq=5).result()
    ids.append(rollout_id)
    finals.append(attempt_id)
    # a rollout whose first attempt failed: only the second is final, and only it is packed
    rollout_id, first = attempt(store, max_attempts=2)
    _chat(store, rollout_id, first, rng, 2)
    store.complete(first, "failed", error="boom").result()
    (claim,) = store.claim("w", 1, 60).result()
    _chat(store, rollout_id, claim.attempt.id, rng, 3)
    store.complete(claim.attempt.id, "succeeded").result()  # no reward returned: the rollout's final reward is None
    ids.append(rollout_id)
    finals.append(claim.attempt.id)
    # a succeeded attempt without a single call
    rollout_id, attempt_id = attempt(store, max_attempts=2)
    store.complete(attempt_id, "succeeded", reward=0.0).result()
    ids.append(rollout_id)
    finals.append(attempt_id)

    assert _packed(store) == set(finals)
    packed = _seen(store.trainable_rollouts(ids))
    assert packed == _from_rows(store, ids)
    assert [len(r[2]) for r in packed] == [6, 3, 0]
    assert packed[0][2][4][14:17] == [None, None, None]  # the call with no ids
    assert packed[0][2][5][16] is None and packed[0][2][5][5] == "k"  # no log-probs; its agent key


def test_what_reaches_a_succeeded_attempt_later_is_packed_with_it(store: Store) -> None:
    rollout_id, attempt_id = attempt(store, max_attempts=2)
    _chat(store, rollout_id, attempt_id, random.Random(4), 2)
    store.add_llm_call(llm_call(rollout_id, attempt_id, 2, [7, 8], [9], attribution=Attribution.unhooked)).result()
    store.complete(attempt_id, "succeeded", reward=1.0).result()
    (before,) = store.trainable_rollouts([rollout_id])
    assert [w.name for w in before.rewards] == ["final"]
    assert [c.seq for c in before.llm_calls] == [0, 1, 2]
    assert before.llm_calls[2].attribution is Attribution.unhooked

    # a reward computed from the trace afterwards (AIR)
    store.add_rewards(
        [
            RewardIn(
                rollout_id=rollout_id,
                attempt_id=attempt_id,
                value=0.5,
                name="air",
                after_llm_seq=0,
                source=RewardSource.automatic,
            )
        ]
    ).result()
    (found,) = store.trainable_rollouts([rollout_id])
    assert sorted(w.name for w in found.rewards) == ["air", "final"]
    # a call that finished after its attempt had: kept, not trainable
    _chat(store, rollout_id, attempt_id, random.Random(5), 1, first=3)
    (found,) = store.trainable_rollouts([rollout_id])
    assert [c.seq for c in found.llm_calls] == [0, 1, 2, 3]
    assert not found.llm_calls[3].trainable and "had ended" in (found.llm_calls[3].not_trainable_reason or "")
    # a repeated report that marks the unhooked call's agent name as lost
    store.complete(attempt_id, "succeeded", reward=1.0, agent_scopes=1).result()
    (found,) = store.trainable_rollouts([rollout_id])
    assert found.llm_calls[2].attribution is Attribution.missed
    assert _seen([found]) == _from_rows(store, [rollout_id])


def test_attempts_without_a_pack_are_read_from_their_rows(store: Store, tmp_path: Path) -> None:
    rng = random.Random(6)
    old_rollout, old_attempt = attempt(store, max_attempts=2)
    _chat(store, old_rollout, old_attempt, rng, 3)
    store.complete(old_attempt, "succeeded", reward=1.0).result()
    expected = _seen(store.trainable_rollouts([old_rollout]))
    store.close()
    # the store as schema 6 left it: the same rows, no packs
    with sqlite3.connect(tmp_path / "agl.sqlite") as conn:
        conn.execute("DROP TABLE attempt_packs")
        downgrade(conn, to=6)

    reopened = Store(tmp_path)
    try:
        assert _packed(reopened) == set()
        new_rollout, new_attempt = attempt(reopened, max_attempts=2)
        _chat(reopened, new_rollout, new_attempt, rng, 2)
        reopened.complete(new_attempt, "succeeded", reward=0.0).result()
        assert _packed(reopened) == {new_attempt}
        found = reopened.trainable_rollouts([old_rollout, new_rollout])
        assert _seen(found[:1]) == expected
        assert [len(r.llm_calls) for r in found] == [3, 2]
    finally:
        reopened.close()


def test_an_attempt_holding_ids_as_json_text_gets_no_pack(store: Store) -> None:
    rollout_id, attempt_id = attempt(store, max_attempts=2)
    _chat(store, rollout_id, attempt_id, random.Random(7), 2)
    with sqlite3.connect(store.path) as conn:  # as a call written before schema 4 holds them
        conn.execute("UPDATE llm_calls SET response_ids='[1, 2]', logprobs='[-0.5, -0.25]' WHERE seq=1")
    store.complete(attempt_id, "succeeded", reward=1.0).result()

    assert _packed(store) == set()
    (found,) = store.trainable_rollouts([rollout_id])
    assert list(found.llm_calls[1].response_ids or []) == [1, 2]
    assert list(found.llm_calls[1].logprobs or []) == [-0.5, -0.25]


def test_a_late_call_whose_repack_fails_is_not_stored(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    import agl.store.records as records

    rollout_id, attempt_id = attempt(store, max_attempts=2)
    _chat(store, rollout_id, attempt_id, random.Random(8), 2)
    store.complete(attempt_id, "succeeded", reward=1.0).result()

    def broken(conn: sqlite3.Connection, attempt_id: str) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(records, "repack_if_packed", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        store.add_llm_call(llm_call(rollout_id, attempt_id, 2, [1, 2], [3])).result()

    # neither the call nor a changed pack: the pack still matches the rows, and the writer goes on
    (found,) = store.trainable_rollouts([rollout_id])
    assert [c.seq for c in found.llm_calls] == [0, 1]
    assert _seen([found]) == _from_rows(store, [rollout_id])
    store.add_rewards(
        [RewardIn(rollout_id=rollout_id, attempt_id=attempt_id, value=0.5, name="air", source=RewardSource.automatic)]
    ).result()
    (found,) = store.trainable_rollouts([rollout_id])
    assert sorted(w.name for w in found.rewards) == ["air", "final"]
