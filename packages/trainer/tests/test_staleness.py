"""`keep_fresh` (agl_trainer.run.staleness) on hand-made transitions: each is aged by its oldest call's version."""

from __future__ import annotations

from agl.learn.transitions import Transition
from agl_trainer.run.staleness import UNKNOWN, keep_fresh

# versions as the store numbers them → the step whose rollouts each served (a resume published 4 for step 2 again)
VERSION_STEPS = {1: 0, 2: 1, 3: 2, 4: 2, 5: 3}


def transition(*call_ids: str) -> Transition:
    return Transition("r", "t", "a", 0, None, [1], [2], [1], [-0.5], None, list(call_ids))


def test_transitions_older_than_k_versions_are_dropped_and_counted() -> None:
    calls = {"c0": 1, "c1": 2, "c2": 3, "c2b": 4, "c3": 5, "x": None}
    batch = [transition("c3"), transition("c2"), transition("c2b"), transition("c1"), transition("c0")]
    for k, kept in (
        (0, ["c3"]),
        (1, ["c3", "c2", "c2b"]),
        (2, ["c3", "c2", "c2b", "c1"]),
        (3, ["c3", "c2", "c2b", "c1", "c0"]),
    ):
        fresh = keep_fresh(batch, calls, VERSION_STEPS, updating=3, max_staleness=k)
        assert sorted(t.call_ids[0] for t in fresh.kept) == sorted(kept), k
        assert fresh.dropped == len(batch) - len(kept)
        assert fresh.histogram == {"0": 1, "1": 2, "2": 1, "3": 1}


def test_a_merged_turn_is_as_old_as_its_oldest_call_and_unknown_versions_are_kept() -> None:
    calls = {"old": 2, "new": 5, "x": None}
    merged = transition("new", "old")  # a chat whose first turn was sampled two versions back
    fresh = keep_fresh([merged, transition("x"), transition("gone")], calls, VERSION_STEPS, updating=3, max_staleness=1)
    assert [t.call_ids for t in fresh.kept] == [["x"], ["gone"]] and fresh.dropped == 1
    assert fresh.histogram == {"2": 1, UNKNOWN: 2}
