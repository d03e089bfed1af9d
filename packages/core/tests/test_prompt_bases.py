"""Prompts stored as the ids they add to an earlier call's (schema 6, agl.store.prompt_bases): every read gives
back the whole prompt that was sent, a base is always a call stored whole, and a multi-turn attempt takes a
fraction of the bytes."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest
from factories import attempt, downgrade, llm_call

from agl.store import Store
from agl.store.prompt_bases import _BASE, PromptBases


def _chat(rng: random.Random, turns: int) -> list[tuple[list[int], list[int]]]:
    """(prompt, response) of each turn of one chat: each prompt is the previous prompt + response + a new turn."""
    prompt = [rng.randrange(50_000) for _ in range(200)]
    out = []
    for _ in range(turns):
        response = [rng.randrange(50_000) for _ in range(30)]
        out.append((prompt, response))
        prompt = prompt + response + [rng.randrange(50_000) for _ in range(15)]
    return out


def _stored(store: Store, attempt_id: str) -> list[tuple[int, int, int | None, int | None]]:
    """(seq, stored prompt bytes, base seq, base length) of each call of the attempt, as the file holds them."""
    with sqlite3.connect(store.path) as conn:
        return conn.execute(
            "SELECT seq, length(prompt_ids), prompt_base_seq, prompt_base_len FROM llm_calls WHERE attempt_id=?"
            " ORDER BY seq",
            (attempt_id,),
        ).fetchall()


def _every_read(store: Store, rollout_id: str) -> list[list[tuple[list[int] | None, list[int] | None]]]:
    """(prompt, response) of each call, as each of the store's reads gives them back."""
    detail = store.rollout_details([rollout_id])[0]
    (trainable,) = store.trainable_rollouts([rollout_id])
    finals = [call for rollout, call in store.iter_final_llm_calls() if rollout.id == rollout_id]
    return [
        [(c.prompt_ids, c.response_ids) for c in store.llm_calls(rollout_id)],
        [(c.prompt_ids, c.response_ids) for c in detail.llm_calls],
        [(c.prompt_ids, c.response_ids) for c in finals],
        [
            (None if c.prompt_ids is None else list(c.prompt_ids), list(c.response_ids or []))
            for c in trainable.llm_calls
        ],
    ]


def test_a_multi_turn_chat_is_stored_as_what_each_turn_adds_and_read_back_whole(store: Store) -> None:
    rollout_id, attempt_id = attempt(store)
    chat = _chat(random.Random(1), 6)
    for seq, (prompt, response) in enumerate(chat):
        store.add_llm_call(llm_call(rollout_id, attempt_id, seq, prompt, response)).result()
    store.complete(attempt_id, "succeeded", reward=1.0).result()

    stored = _stored(store, attempt_id)
    assert stored[0][2] is None and stored[0][1] == 4 * len(chat[0][0])  # the first call is whole: the base
    for seq, length, base_seq, base_len in stored[1:]:
        prev_prompt, prev_response = chat[base_seq or 0]
        assert base_seq == 0 and base_len is not None
        assert length == 4 * (len(chat[seq][0]) - base_len)
        assert chat[seq][0][:base_len] == (prev_prompt + prev_response)[:base_len]
    whole = sum(4 * len(p) for p, _ in chat)
    assert sum(s[1] for s in stored) < whole / 2
    for read in _every_read(store, rollout_id):
        assert read == [(p, r) for p, r in chat]


def test_a_call_sharing_less_than_half_is_stored_whole_and_bases_the_calls_after_it(store: Store) -> None:
    rollout_id, attempt_id = attempt(store)
    rng = random.Random(2)
    first, second = _chat(rng, 2)
    other = [rng.randrange(50_000) for _ in range(50)]
    calls = [
        first,
        second,  # extends the first: stored against it
        (first[0][:20] + other, other[:5]),  # begins with only part of the first prompt: whole
        (first[0][:20] + other + other[:5] + [7, 8], [9]),  # extends the third, which is whole: its base
        ([1, 2, 3], [4]),  # begins with no earlier prompt: whole
        (None, [5]),  # no ids at all
        ([1, 2, 3, 4, 6], [7]),  # the latest whole call's prompt + response + one id (the one before has none)
        ([1, 2, 3, *range(11, 21)], [8]),  # shares 3 of its 13 ids with it: whole
    ]
    for seq, (prompt, response) in enumerate(calls):
        store.add_llm_call(llm_call(rollout_id, attempt_id, seq, prompt, response)).result()
    store.complete(attempt_id, "succeeded", reward=1.0).result()
    assert [(s[0], s[2]) for s in _stored(store, attempt_id)] == [
        (0, None),
        (1, 0),
        (2, None),
        (3, 2),
        (4, None),
        (5, None),
        (6, 4),
        (7, None),
    ]
    for read in _every_read(store, rollout_id):
        assert read == calls


def test_calls_stored_out_of_order_are_read_back_whole(store: Store) -> None:
    """Concurrent calls of one attempt may be stored in any order: a base is an earlier seq stored whole."""
    rollout_id, attempt_id = attempt(store)
    chat = _chat(random.Random(3), 4)
    for seq in (0, 2, 1, 3):
        store.add_llm_call(llm_call(rollout_id, attempt_id, seq, *chat[seq])).result()
    store.complete(attempt_id, "succeeded", reward=1.0).result()
    stored = _stored(store, attempt_id)
    bases = {seq: base for seq, _, base, _ in stored}
    assert all(base is None or (base < seq and bases[base] is None) for seq, base in bases.items())
    for read in _every_read(store, rollout_id):
        assert read == [(p, r) for p, r in chat]


def test_calls_of_a_store_from_schema_5_stay_whole_and_base_new_calls(tmp_path: Path) -> None:
    s = Store(tmp_path)
    rollout_id, attempt_id = attempt(s)
    chat = _chat(random.Random(4), 3)
    s.add_llm_call(llm_call(rollout_id, attempt_id, 0, *chat[0])).result()
    s.close()
    db = sqlite3.connect(tmp_path / "agl.sqlite")
    downgrade(db, to=5)
    db.commit()
    db.close()
    with Store(tmp_path) as s:
        for seq in (1, 2):
            s.add_llm_call(llm_call(rollout_id, attempt_id, seq, *chat[seq])).result()
        assert [(seq, base) for seq, _, base, _ in _stored(s, attempt_id)] == [(0, None), (1, 0), (2, 0)]
        assert [(c.prompt_ids, c.response_ids) for c in s.llm_calls(rollout_id)] == [(p, r) for p, r in chat]


def test_a_read_that_missed_the_base_says_so() -> None:
    bases = PromptBases()
    assert bases.whole("a", 0, b"\x01\x00\x00\x00", b"\x02\x00\x00\x00", None, None) == b"\x01\x00\x00\x00"
    assert bases.whole("a", 1, b"\x03\x00\x00\x00", b"", 0, 2) == b"\x01\x00\x00\x00\x02\x00\x00\x00\x03\x00\x00\x00"
    with pytest.raises(RuntimeError, match="call 0's prompt, which this read did not meet first"):
        bases.whole("b", 1, b"\x03\x00\x00\x00", b"", 0, 2)  # another attempt: its call 0 was not read


def test_an_attempt_of_many_calls_finds_its_base_in_one_step(store: Store) -> None:
    """Hundreds of calls naming one base: each insert finds the latest call stored whole through the partial
    index of such calls, never by walking back over the calls that name it (that made inserts O(calls))."""
    rollout_id, attempt_id = attempt(store)
    prompt = [5] * 40
    for seq in range(300):
        store.add_llm_call(llm_call(rollout_id, attempt_id, seq, prompt, [6])).result()
    stored = _stored(store, attempt_id)
    assert stored[0][2] is None and {base for _, _, base, _ in stored[1:]} == {0}
    with sqlite3.connect(store.path) as conn:
        plan = " ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {_BASE}", (attempt_id, 300)))
        assert "USING INDEX llm_calls_bases" in plan, plan
        # the index holds the one call stored whole, not the 299 that name it
        assert conn.execute(
            "SELECT count(*) FROM llm_calls INDEXED BY llm_calls_bases WHERE attempt_id=? AND prompt_base_seq IS NULL",
            (attempt_id,),
        ).fetchone() == (1,)
