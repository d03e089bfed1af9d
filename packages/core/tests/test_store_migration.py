"""A store written before schema version 4 (token ids and log-probs as JSON text) opens with today's store, reads
back exactly what was written, and takes new calls (as BLOBs) beside the old rows."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from agl.schema import Attribution, LLMCall, RolloutStatus
from agl.store import Store
from agl.store.schema import SCHEMA_VERSION

DATA = Path(__file__).parent / "data"
# what data/make_store_v3.py wrote (the inputs it was given, not outputs of the code under test)
PROMPT = [1, 2, 3, 70000, 5]
RESPONSE = [9, 8, 7]
LOGPROBS = [-0.25, -1.5, -0.0078125]


@pytest.fixture
def v3_run(tmp_path: Path) -> Path:
    shutil.copy(DATA / "store-v3.sqlite", tmp_path / "agl.sqlite")
    return tmp_path


def _version(path: Path) -> int:
    with sqlite3.connect(path / "agl.sqlite") as conn:
        return int(conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0])


def test_the_fixture_is_a_version_3_store_with_json_token_ids(v3_run: Path) -> None:
    assert _version(v3_run) == 3
    with sqlite3.connect(v3_run / "agl.sqlite") as conn:
        assert {row[0] for row in conn.execute("SELECT typeof(prompt_ids) FROM llm_calls")} == {"text"}


def test_a_version_3_store_reads_back_what_was_written(v3_run: Path) -> None:
    with Store(v3_run) as store:
        assert _version(v3_run) == SCHEMA_VERSION
        succeeded, _ = store.list_rollouts(status=RolloutStatus.succeeded.value)
        assert len(succeeded) == 1
        detail = store.rollout_detail(succeeded[0].id)
        first, second = detail.llm_calls
        assert (first.prompt_ids, first.response_ids, first.logprobs) == (PROMPT, RESPONSE, LOGPROBS)
        assert (second.prompt_ids, second.response_ids, second.logprobs) == (PROMPT + RESPONSE + [11], [12], None)
        assert first.temperature == 0.7 and first.request["messages"][0]["content"] == "2+2?"
        assert first.agent_key is None and first.agent_name == "solver"  # a column added after version 3
        assert [(r.name, r.value, r.after_llm_seq) for r in detail.rewards if r.name == "tool_ok"] == [
            ("tool_ok", 0.25, 0)
        ]
        assert [s.name for s in detail.spans] == ["tool calc"]
        assert detail.rollout.final_reward == 1.0
        assert store.latest_model_version() is not None
        assert store.counts()["llm_calls"] == 2
        # the trainer's bulk read path gives the same as the one-rollout read
        assert store.rollout_details([succeeded[0].id])[0].llm_calls == detail.llm_calls
        # and the training read, packed, the same ids
        (trainable,) = store.trainable_rollouts([succeeded[0].id])
        assert [
            (list(c.prompt_ids or []), list(c.response_ids or []), None if c.logprobs is None else list(c.logprobs))
            for c in trainable.llm_calls
        ] == [(PROMPT, RESPONSE, LOGPROBS), (PROMPT + RESPONSE + [11], [12], None)]


def test_new_calls_go_in_beside_the_old_rows_as_blobs(v3_run: Path) -> None:
    with Store(v3_run) as store:
        rollout = store.list_rollouts(status=RolloutStatus.succeeded.value)[0][0]
        old = store.llm_calls(rollout.id)[0]
        # a retried rollout of the old run: claim it and add a call in the new encoding
        queued = store.list_rollouts(status=RolloutStatus.queued.value)[0]
        claim = store.claim("w2", 1, 60).result()[0]
        assert claim.rollout.id == queued[0].id
        new = LLMCall(
            **{
                **old.model_dump(),
                "id": "llm-new",
                "rollout_id": claim.rollout.id,
                "attempt_id": claim.attempt.id,
                "seq": 0,
                "attribution": Attribution.scope,
                "prompt_ids": [2**31 - 1, 0, 5],
                "response_ids": [4],
                "logprobs": [-3.0],
            }
        )
        store.add_llm_call(new).result()
        assert store.llm_calls(claim.rollout.id)[0].prompt_ids == [2**31 - 1, 0, 5]
        assert store.llm_calls(rollout.id)[0].prompt_ids == PROMPT
    with sqlite3.connect(v3_run / "agl.sqlite") as conn:
        kinds = dict(conn.execute("SELECT id, typeof(prompt_ids) FROM llm_calls").fetchall())
    assert kinds["llm-new"] == "blob" and kinds["llm-0"] == "text"


def test_a_store_newer_than_this_agl_is_refused_and_left_as_it_was(v3_run: Path) -> None:
    with sqlite3.connect(v3_run / "agl.sqlite") as conn:
        conn.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION + 1),))
    with pytest.raises(RuntimeError, match="newer than this agl"):
        Store(v3_run)
    assert _version(v3_run) == SCHEMA_VERSION + 1
    with sqlite3.connect(v3_run / "agl.sqlite") as conn:
        assert conn.execute("SELECT COUNT(*) FROM llm_calls").fetchone()[0] == 2
