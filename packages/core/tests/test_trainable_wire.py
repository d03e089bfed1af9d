"""The training read over HTTP (agl.common.trainable_wire): the binary and JSON forms give the same transitions, credit
and AIR rewards as the store's own read, the binary body is refused with a clear error when cut short or
changed, and a real `agl serve` answers each client in the form it asks for."""

from __future__ import annotations

import random
import struct
import zlib
from array import array
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from factories import attempt, fill_training_cases, llm_call

from agl.client import Client
from agl.common.call_packs import pack_calls, unpack_calls
from agl.common.processes import start_server
from agl.common.trainable import TrainableRollout, call_values
from agl.common.trainable_wire import BINARY_TYPE, WireError, from_binary, from_json, to_binary, to_json
from agl.learn.air import AnswerParseRule, ToolStatusRule, with_air
from agl.learn.credit import assign_credit
from agl.learn.selection import AgentSelection
from agl.learn.transitions import build_episodes
from agl.schema import EnqueueRequest, TaskIn
from agl.store import Store

RULES = (ToolStatusRule(error_reward=-0.3), AnswerParseRule(parse=lambda text: int(text)))
FORMS: dict[str, tuple[Callable[[Sequence[TrainableRollout]], bytes], Callable[[bytes], list[TrainableRollout]]]] = {
    "binary": (to_binary, from_binary),
    "json": (to_json, from_json),
}


def _seen(rollouts: Sequence[TrainableRollout]) -> list[Any]:
    """Everything training reads of the rollouts, as plain values (arrays as lists, the answer decoded)."""
    return [
        (
            r.rollout,
            r.task,
            r.spans,
            r.rewards,
            [
                [list(v) if isinstance(v, array) else v for v in call_values(c)] + [c.response_message]
                for c in r.llm_calls
            ],
        )
        for r in rollouts
    ]


def _built(rollouts: Sequence[TrainableRollout], strategy: str) -> Any:
    with_rewards = [with_air(r, RULES) for r in rollouts]
    episodes, stats = build_episodes(with_rewards, AgentSelection.parse("solver,check"), max_tokens=11)
    credit = assign_credit(episodes, strategy)
    transitions = [
        (t.rollout_id, t.seq, list(t.prompt_ids), list(t.response_ids), t.reward, t.advantage)
        for e in episodes
        for t in e.transitions
    ]
    return transitions, stats, credit


@pytest.mark.parametrize("form", sorted(FORMS))
def test_each_form_gives_what_the_store_read_gives(store: Store, form: str) -> None:
    encode, decode = FORMS[form]
    ids = fill_training_cases(store)
    read = store.trainable_rollouts(ids)
    back = decode(encode(read))
    assert _seen(back) == _seen(read)
    assert all(isinstance(c.prompt_ids, array) for r in back for c in r.llm_calls if c.prompt_ids is not None)
    for strategy in ("grpo", "discounted"):
        transitions, stats, credit = _built(back, strategy)
        assert (transitions, stats, credit) == _built(read, strategy)
        assert transitions and any(t[4] == pytest.approx(0.25 - 0.3) for t in transitions)  # AIR's tool penalty
    # token ids never travel as JSON numbers
    assert b"[7,8,9" not in encode(read)


def test_the_binary_body_holds_each_prompt_once(store: Store) -> None:
    """A multi-turn chat's prompts are sent as what each adds to the call before: 40 turns of a growing chat take
    about the ids of the last prompt, not the sum of all of them."""
    rng = random.Random(3)
    rollout_id, attempt_id = attempt(store)
    chat = [rng.randrange(50_000) for _ in range(200)]
    sent = []
    for seq in range(40):
        response = [rng.randrange(50_000) for _ in range(20)]
        sent.append(llm_call(rollout_id, attempt_id, seq, list(chat), response))
        chat += response + [rng.randrange(50_000) for _ in range(10)]
    sent.append(llm_call(rollout_id, attempt_id, 40, [1, 2, 3], [4]))  # a fresh chat: held whole
    sent.append(llm_call(rollout_id, attempt_id, 41, [1, 2, 3, 4, 5], [6]))  # extends the fresh one, answer too
    sent.append(llm_call(rollout_id, attempt_id, 42, None, None, trainable=False, not_trainable_reason="no ids"))
    for call in sent:
        store.add_llm_call(call).result()
    store.complete(attempt_id, "succeeded", reward=1.0).result()
    (read,) = store.trainable_rollouts([rollout_id])
    rows, ids, floats = pack_calls(read.llm_calls)
    whole = sum(len(c.prompt_ids or []) + len(c.response_ids or []) for c in sent)
    assert len(ids) < len(chat) + 100 < whole // 10
    assert [r[13] for r in rows[-3:]] == [None, 40, None]  # the fresh chat is a base; the call after it names it
    back, at, fat = unpack_calls(rollout_id, attempt_id, rows, ids, floats, where="test")
    assert (at, fat) == (len(ids), len(floats))
    assert [(c.prompt_ids, c.response_ids, c.logprobs) for c in back] == [
        (c.prompt_ids, c.response_ids, c.logprobs) for c in read.llm_calls
    ]
    assert [list(c.prompt_ids or []) for c in back] == [c.prompt_ids or [] for c in sent]


def _body(store: Store) -> bytes:
    return to_binary(store.trainable_rollouts(fill_training_cases(store)))


def _with_crc(body: bytes) -> bytes:
    """A changed body with its checksum made right again (what a buggy encoder would send)."""
    return body[:-4] + struct.pack("<I", zlib.crc32(body[:-4]))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda b: b[: len(b) // 2], "cut short"),
        (lambda b: b[:10], "less than its header"),
        (lambda b: b + b"\0", "longer than its header says"),
        (lambda b: b[:100] + bytes([b[100] ^ 1]) + b[101:], "corrupted: its checksum does not match"),
        (lambda b: b[:-5] + bytes([b[-5] ^ 0x40]) + b[-4:], "corrupted"),
        (lambda b: b"AGLTRB2\n" + b[8:], "another version of agl's"),
        (lambda b: b'[{"rollout": 1}]' + b[16:], "not agl's binary"),
        (lambda b: _with_crc(b[:8] + (10**9).to_bytes(8, "little") + b[16:]), "cut short"),
    ],
)
def test_a_body_cut_short_or_changed_is_refused_clearly(store: Store, change: Any, message: str) -> None:
    body = _body(store)
    with pytest.raises(WireError, match=message):
        from_binary(change(body))


def test_sections_that_do_not_fit_together_are_refused(store: Store) -> None:
    """A checksum only proves the bytes are those sent: a body whose sections disagree is still refused."""
    read = store.trainable_rollouts(fill_training_cases(store))
    body = to_binary(read)
    header = struct.Struct("<8s7Q")
    magic, *lengths = header.unpack_from(body)
    # one token id fewer than the calls name: the ids section is cut by 4 bytes
    ids_at = header.size + sum(lengths[:5])
    short = body[:ids_at] + body[ids_at + 4 : -4]
    lengths[5] -= 4
    with pytest.raises(WireError, match="past the arrays' end"):
        from_binary(_with_crc(header.pack(magic, *lengths) + short[header.size :] + b"\0\0\0\0"))
    # a rollout whose task is missing
    no_tasks = body
    _, *lengths = header.unpack_from(no_tasks)
    tasks_at = header.size + lengths[0]
    cut = no_tasks[:tasks_at] + b"[]" + no_tasks[tasks_at + lengths[1] : -4]
    lengths[1] = 2
    with pytest.raises(WireError, match="without its task"):
        from_binary(_with_crc(header.pack(magic, *lengths) + cut[header.size :] + b"\0\0\0\0"))
    # records that are not valid models
    bad = b'[{"id": 3}]'
    cut = no_tasks[: header.size] + bad + no_tasks[header.size + lengths[0] : -4]
    _, *lengths = header.unpack_from(no_tasks)
    lengths[0] = len(bad)
    with pytest.raises(WireError, match="not valid"):
        from_binary(_with_crc(header.pack(magic, *lengths) + cut[header.size :] + b"\0\0\0\0"))


def test_a_real_server_answers_each_client_in_its_form(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with Store(run_dir) as store:
        ids = fill_training_cases(store)
        (extra,) = store.enqueue(EnqueueRequest(task=TaskIn(input="unclaimed"))).result()  # no attempt yet
        expected = _seen(store.trainable_rollouts([*ids, extra.id]))
    server = start_server(run_dir)
    try:
        with Client(server.url) as client:
            assert _seen(client.trainable_rollouts([*ids, extra.id, "ro-unknown"])) == expected
        url = f"{server.url}/api/v1/rollouts/trainable"
        answers = {
            accept: httpx.post(url, json={"ids": [*ids, extra.id]}, headers={"accept": accept}, timeout=30)
            for accept in (BINARY_TYPE, "application/json", "*/*")
        }
        assert answers[BINARY_TYPE].headers["content-type"] == BINARY_TYPE
        assert _seen(from_binary(answers[BINARY_TYPE].content)) == expected
        for accept in ("application/json", "*/*"):  # any other client gets JSON
            assert answers[accept].headers["content-type"] == "application/json"
            assert _seen(from_json(answers[accept].content)) == expected
        assert len(answers[BINARY_TYPE].content) < len(answers["application/json"].content)
    finally:
        server.stop()
