"""agl's transitions → the batch verl's actor worker takes, in the layout `RayPPOTrainer` builds after a rollout.

verl's padded layout: `prompts` left-padded, `responses` right-padded, `input_ids` = the two side by side,
`attention_mask` 1 on every real token, `position_ids` counted from each sequence's first real token, and
`response_mask` 1 on the response tokens the policy produced (0 on the tokens an environment appended between
merged turns, and on padding). Per sequence: `temperature` (the one it was sampled at: verl scales each
sequence's logits by its own), and for an update `old_log_probs`, `advantages` and `agl_seq_weights`.

The batch is padded with placeholder rows (one pad token of prompt, one of response, response mask 0) to a
multiple of the data-parallel size, since verl splits it evenly over the ranks; those rows carry no loss (verl's
sequence-mean skips sequences without response tokens) and are dropped from every result. With several ranks the
rows are ordered so that each rank's chunk holds about the same number of tokens (`balanced_order`).
`to_worker_input` then does what `RayPPOTrainer._update_actor` / `_compute_old_log_prob` do: DataProto →
TensorDict → verl's no-padding (nested) layout, plus the call's settings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from agl.learn.transitions import Transition
from agl_trainer.verl.loss import SEQ_WEIGHTS


@dataclass
class PackedBatch:
    """The padded tensors of a batch: transition i sits at row `positions[i]` (the other rows are placeholders)
    and has `response_lengths[i]` response tokens."""

    tensors: dict[str, torch.Tensor]
    rows: int
    response_lengths: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    # the one temperature every transition was sampled at, handed to verl as a scalar (its fused log-prob kernels
    # take no per-sequence temperature, and a scalar 1.0 skips scaling the logits); None: a tensor, one per row
    shared_temperature: float | None = None

    @property
    def size(self) -> int:
        return int(self.tensors["input_ids"].shape[0])


def balanced_order(lengths: Sequence[int], ranks: int) -> list[int | None]:
    """The rows of a batch in the order that gives each of `ranks` data-parallel ranks (verl splits the batch into
    equal contiguous chunks) about the same number of tokens, as verl's trainer balances its batches: the longest
    first, each to the rank with the fewest tokens that has a row free. `None` marks a placeholder row (the batch
    is padded to a multiple of `ranks`). Without balancing, one rank can get all the long transitions and every
    other rank waits for it at each step."""
    per_rank = -(-len(lengths) // ranks)
    chunks: list[list[int]] = [[] for _ in range(ranks)]
    totals = [0] * ranks
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        rank = min((r for r in range(ranks) if len(chunks[r]) < per_rank), key=lambda r: (totals[r], r))
        chunks[rank].append(i)
        totals[rank] += lengths[i]
    order: list[int | None] = []
    for chunk in chunks:
        order += sorted(chunk) + [None] * (per_rank - len(chunk))
    return order


def pack(
    transitions: Sequence[Transition],
    *,
    pad_id: int,
    multiple_of: int = 1,
    advantages: Sequence[float] | None = None,
    seq_weights: Sequence[float] | None = None,
    balance: bool = False,
) -> PackedBatch:
    """The padded tensors of `transitions` (log-probs, advantages and weights only when `advantages` is given).
    `balance`: rows ordered so that each of the `multiple_of` ranks gets about the same tokens (`balanced_order`);
    else in the given order, placeholders last."""
    if not transitions:
        raise ValueError("an empty batch")
    for t in transitions:
        if not t.prompt_ids or not t.response_ids:
            raise ValueError(f"transition {t.call_ids} has an empty prompt or response")
        if len(t.response_mask) != len(t.response_ids):
            raise ValueError(f"transition {t.call_ids}: response_mask and response_ids differ in length")
    rows = len(transitions)
    size = -(-rows // multiple_of) * multiple_of
    if balance and multiple_of > 1:
        order = balanced_order([len(t.prompt_ids) + len(t.response_ids) for t in transitions], multiple_of)
    else:
        order = [*range(rows), *([None] * (size - rows))]
    positions = [0] * rows
    for position, index in enumerate(order):
        if index is not None:
            positions[index] = position
    placeholders = [position for position, index in enumerate(order) if index is None]
    prompt_len = max(len(t.prompt_ids) for t in transitions)
    response_len = max(len(t.response_ids) for t in transitions)
    prompts = torch.full((size, prompt_len), pad_id, dtype=torch.long)
    responses = torch.full((size, response_len), pad_id, dtype=torch.long)
    prompt_attention = torch.zeros((size, prompt_len), dtype=torch.long)
    response_attention = torch.zeros((size, response_len), dtype=torch.long)
    response_mask = torch.zeros((size, response_len), dtype=torch.long)
    temperature = torch.ones(size, dtype=torch.float32)
    for t, i in zip(transitions, positions, strict=True):
        p, r = len(t.prompt_ids), len(t.response_ids)
        prompts[i, prompt_len - p :] = torch.tensor(t.prompt_ids, dtype=torch.long)
        prompt_attention[i, prompt_len - p :] = 1
        responses[i, :r] = torch.tensor(t.response_ids, dtype=torch.long)
        response_attention[i, :r] = 1
        response_mask[i, :r] = torch.tensor(t.response_mask, dtype=torch.long)
        temperature[i] = float(t.temperature)
    # placeholder rows: one token each, nothing trained
    prompt_attention[placeholders, -1] = 1
    response_attention[placeholders, 0] = 1
    attention = torch.cat([prompt_attention, response_attention], dim=1)
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention,
        "position_ids": torch.clip(torch.cumsum(attention, dim=-1) - 1, min=0),
        "response_mask": response_mask,
        "temperature": temperature,
    }
    if advantages is not None:
        if seq_weights is None or len(advantages) != rows or len(seq_weights) != rows:
            raise ValueError("advantages and seq_weights need one value per transition")
        old = torch.zeros((size, response_len), dtype=torch.float32)
        adv = torch.zeros((size, response_len), dtype=torch.float32)
        weights = torch.zeros(size, dtype=torch.float32)
        for k, (t, i) in enumerate(zip(transitions, positions, strict=True)):
            r = len(t.response_ids)
            if t.logprobs is None or len(t.logprobs) != r:
                raise ValueError(f"transition {t.call_ids} has no behaviour log-probs for each response token")
            old[i, :r] = torch.tensor(t.logprobs, dtype=torch.float32)
            adv[i, :r] = float(advantages[k])
            weights[i] = float(seq_weights[k])
        tensors.update({"old_log_probs": old, "advantages": adv, SEQ_WEIGHTS: weights})
    lengths = [len(t.response_ids) for t in transitions]
    temperatures = {float(t.temperature) for t in transitions}
    shared = temperatures.pop() if len(temperatures) == 1 else None
    if shared is not None:
        del tensors["temperature"]
    return PackedBatch(
        tensors=tensors, rows=rows, response_lengths=lengths, positions=positions, shared_temperature=shared
    )


def to_worker_input(batch: PackedBatch, extra: Mapping[str, torch.Tensor] | None = None, **settings: Any) -> Any:
    """The TensorDict verl's worker methods take (`compute_log_prob`, `update_actor`), as `RayPPOTrainer` builds
    it: a DataProto's TensorDict in verl's no-padding layout, with `settings` as its non-tensor entries."""
    from verl import DataProto
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    data = DataProto.from_dict(tensors={**batch.tensors, **(extra or {})})
    td = left_right_2_no_padding(data.to_tensordict())
    if batch.shared_temperature is not None:
        settings = {"temperature": batch.shared_temperature, **settings}
    tu.assign_non_tensor(td, **settings)
    return td


def response_values(output: Any, key: str, td: Any, batch: PackedBatch) -> torch.Tensor:
    """A per-token output of the worker (nested, one row per sequence) as the padded (rows, response) tensor."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import no_padding_2_padding

    values: torch.Tensor = no_padding_2_padding(tu.get(output, key), td).float()
    return values[batch.positions]  # the transitions' own order, placeholders dropped


def per_transition(values: torch.Tensor, batch: PackedBatch) -> list[list[float]]:
    return [values[i, :n].tolist() for i, n in enumerate(batch.response_lengths)]
