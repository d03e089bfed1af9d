"""Where a reward sits among its attempt's LLM calls (`after_llm_seq`), as the server sees it.

A worker places a reward after the last LLM call its own process saw answered (`ctx.last_llm_seq`). Calls made by
another process through the attempt's URL (a command-line agent run by `agl.run_cli`, a harness, a program the
agent started) never pass through that counter: a reward emitted after them came with no position, or one too
early, and training dropped it as "before the first transition". The store knows every call of the attempt and
when it was answered, so a reward is placed after the last call stored as answered before the reward was emitted
(its timestamp), unless the position it came with is already later. The trainer's automatic rewards (AIR) keep
the positions they were computed with; a reward that names its position but no time keeps its position (the
caller said where, and the server cannot tell when).
"""

from __future__ import annotations

import sqlite3
import time

from agl.schema import RewardIn, RewardSource

# the last call of an attempt answered by a time: a call's end is its start plus its latency, as the proxy stored it
_LAST_CALL_BEFORE = "SELECT MAX(seq) FROM llm_calls WHERE attempt_id=? AND started_at + latency_s <= ?"


def last_call_before(conn: sqlite3.Connection, attempt_id: str, when: float) -> int | None:
    """The `seq` of the attempt's last call stored as answered at or before `when`; None before any."""
    row = conn.execute(_LAST_CALL_BEFORE, (attempt_id, when)).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def placed(conn: sqlite3.Connection, reward: RewardIn, now: float | None = None) -> RewardIn:
    """`reward` with its position moved after the attempt's last call answered before it, where that is later
    than the position it came with (see the module's docstring); a reward without a time gets `now`'s."""
    if reward.source is RewardSource.automatic:
        return reward
    if reward.timestamp is None and reward.after_llm_seq is not None:
        return reward
    when = reward.timestamp if reward.timestamp is not None else (now if now is not None else time.time())
    last = last_call_before(conn, reward.attempt_id, when)
    if last is None or (reward.after_llm_seq is not None and reward.after_llm_seq >= last):
        return reward if reward.timestamp is not None else reward.model_copy(update={"timestamp": when})
    return reward.model_copy(update={"after_llm_seq": last, "timestamp": when})


def place_unplaced(conn: sqlite3.Connection, rollout_id: str, attempt_id: str) -> None:
    """Place the attempt's rewards still without a position after the last call answered before each (at the
    attempt's completion: a call whose record was written after its reward arrived is among them by then). The
    rollout narrows the search to its rows (rewards are indexed by rollout)."""
    conn.execute(
        "UPDATE rewards SET after_llm_seq = (SELECT MAX(c.seq) FROM llm_calls c WHERE c.attempt_id = rewards.attempt_id"
        " AND c.started_at + c.latency_s <= rewards.timestamp)"
        " WHERE rollout_id=? AND attempt_id=? AND after_llm_seq IS NULL AND source != ?",
        (rollout_id, attempt_id, RewardSource.automatic.value),
    )
