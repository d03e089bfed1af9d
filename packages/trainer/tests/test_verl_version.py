"""`--trainer verl` without a usable verl is a clear error before anything starts; the batch agl hands verl has
verl's layout. None of this needs verl installed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import agl_trainer.verl as agl_verl
from agl.learn.transitions import Transition
from agl_trainer.policy.trainer import PolicyConfig
from agl_trainer.verl import VerlUnavailable, check_version, require_verl
from agl_trainer.verl.backend import VerlPolicy
from agl_trainer.verl.batch import pack
from agl_trainer.verl.loss import SEQ_WEIGHTS


def test_missing_verl_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agl_verl, "verl_version", lambda: None)
    with pytest.raises(VerlUnavailable, match=r'pip install "agl-trainer\[verl\]"'):
        require_verl()
    # the policy refuses before it starts Ray or reads the model
    with pytest.raises(VerlUnavailable, match="verl is not installed"):
        VerlPolicy(Path("/nonexistent"), PolicyConfig())


@pytest.mark.parametrize("version", ["0.5.0", "0.8.9", "0.9.0", "0.10.0", "1.0.0"])
def test_unsupported_versions_are_refused(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    with pytest.raises(VerlUnavailable, match=rf"supports verl >=0.9.1,<0.10, found verl {version}"):
        check_version(version)
    monkeypatch.setattr(agl_verl, "verl_version", lambda: version)
    with pytest.raises(VerlUnavailable, match=r'pip install "agl-trainer\[verl\]"'):
        VerlPolicy(Path("/nonexistent"), PolicyConfig())


@pytest.mark.parametrize("version", ["0.9.1", "0.9.2", "0.9.10"])
def test_supported_versions_pass(version: str) -> None:
    check_version(version)


def transition(prompt: list[int], response: list[int], mask: list[int] | None = None, **kw: object) -> Transition:
    return Transition(
        rollout_id="r",
        task_id="t",
        attempt_id="a",
        seq=0,
        agent_name="x",
        prompt_ids=prompt,
        response_ids=response,
        response_mask=mask or [1] * len(response),
        logprobs=[-1.0] * len(response),
        model_version=None,
        call_ids=["c"],
        **kw,  # type: ignore[arg-type]
    )


def test_batch_has_verls_layout() -> None:
    ts = [
        transition([5, 6, 7], [8, 9], temperature=0.7),
        transition([5], [10, 11, 12], mask=[1, 0, 1], temperature=1.3),
        transition([1, 2], [3]),
    ]
    batch = pack(ts, pad_id=0, multiple_of=2, advantages=[2.0, -1.0, 0.5], seq_weights=[1.0, 0.5, 1.5])
    x = batch.tensors
    assert batch.rows == 3 and batch.size == 4 and batch.response_lengths == [2, 3, 1]
    # prompts left-padded, responses right-padded, side by side
    assert x["prompts"].tolist() == [[5, 6, 7], [0, 0, 5], [0, 1, 2], [0, 0, 0]]
    assert x["responses"].tolist() == [[8, 9, 0], [10, 11, 12], [3, 0, 0], [0, 0, 0]]
    assert torch.equal(x["input_ids"], torch.cat([x["prompts"], x["responses"]], dim=1))
    assert x["attention_mask"].tolist() == [
        [1, 1, 1, 1, 1, 0],
        [0, 0, 1, 1, 1, 1],
        [0, 1, 1, 1, 0, 0],
        [0, 0, 1, 1, 0, 0],  # the placeholder row for the second rank: one token each, nothing trained
    ]
    assert x["position_ids"][1].tolist() == [0, 0, 0, 1, 2, 3]
    # the environment's token in a merged turn is not trained; the placeholder row trains nothing
    assert x["response_mask"].tolist() == [[1, 1, 0], [1, 0, 1], [1, 0, 0], [0, 0, 0]]
    assert x["temperature"].tolist() == pytest.approx([0.7, 1.3, 1.0, 1.0])
    assert x["advantages"][:, 0].tolist() == [2.0, -1.0, 0.5, 0.0]
    assert x[SEQ_WEIGHTS].tolist() == [1.0, 0.5, 1.5, 0.0]
    assert x["old_log_probs"][0].tolist() == [-1.0, -1.0, 0.0]


def test_batch_refuses_transitions_without_behaviour_logprobs() -> None:
    t = transition([1], [2, 3])
    t.logprobs = None
    with pytest.raises(ValueError, match="behaviour log-probs"):
        pack([t], pad_id=0, advantages=[1.0], seq_weights=[1.0])
    assert pack([t], pad_id=0).rows == 1  # log-probs are not needed to compute them


def test_balanced_batches_give_each_rank_about_the_same_tokens() -> None:
    from agl_trainer.verl.batch import balanced_order

    lengths = [900, 850, 800, 820, 30, 20, 40, 25]  # the long transitions happen to come first
    naive = [sum(lengths[:4]), sum(lengths[4:])]  # verl's contiguous split of the given order
    order = balanced_order(lengths, 2)
    chunks = [order[:4], order[4:]]
    totals = [sum(lengths[i] for i in chunk if i is not None) for chunk in chunks]
    assert sorted(i for i in order if i is not None) == list(range(8))  # every row once
    assert max(totals) - min(totals) < 0.2 * (max(naive) - min(naive))
    # an odd batch: one placeholder, in the lighter chunk
    odd = balanced_order([100, 90, 10], 2)
    assert len(odd) == 4 and odd.count(None) == 1


def test_a_balanced_batch_maps_each_transition_to_its_row() -> None:
    ts = [transition([1] * 9, [2] * 9), transition([1], [2]), transition([1] * 8, [2] * 8), transition([1], [2, 2])]
    batch = pack(ts, pad_id=0, multiple_of=2, advantages=[1.0, 2.0, 3.0, 4.0], seq_weights=[1.0] * 4, balance=True)
    x = batch.tensors
    assert sorted(batch.positions) == [0, 1, 2, 3]
    for k, (t, row) in enumerate(zip(ts, batch.positions, strict=True)):
        r = len(t.response_ids)
        assert x["responses"][row, :r].tolist() == t.response_ids
        assert x["advantages"][row, 0].item() == [1.0, 2.0, 3.0, 4.0][k]
    # the two long transitions on different ranks (rows 0-1 go to the first, 2-3 to the second)
    assert {batch.positions[0] // 2, batch.positions[2] // 2} == {0, 1}
    values = torch.arange(4 * 9, dtype=torch.float32).reshape(4, 9)
    assert values[batch.positions][1, 0].item() == values[batch.positions[1], 0].item()


def test_one_shared_temperature_is_handed_to_verl_as_a_scalar() -> None:
    shared = pack([transition([1], [2]), transition([3, 4], [5], temperature=1.0)], pad_id=0, multiple_of=2)
    assert shared.shared_temperature == 1.0 and "temperature" not in shared.tensors
    mixed = pack([transition([1], [2], temperature=0.7), transition([3], [4])], pad_id=0)
    assert mixed.shared_temperature is None and mixed.tensors["temperature"].tolist() == pytest.approx([0.7, 1.0])
