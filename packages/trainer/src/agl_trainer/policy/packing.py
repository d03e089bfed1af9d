"""Packing token sequences into a batch around the beginning they all share.

Agents send the same long beginning (system prompt, tool descriptions, worked examples) with every call. Both
the engine (generation) and the policy trainer (log-probs and gradients) run that shared prefix once and lay
out each sequence's own tokens after it, left-padded so that every sequence ends in the last column:

    [shared prefix][padding…][own tokens]

Position ids continue from the prefix, and the padding is masked out, so the result equals running each
sequence on its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

MIN_SHARED_PREFIX = 16  # shorter shared beginnings are run with the rest


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class Packed:
    prefix: list[int]  # the shared beginning (empty when too short to be worth running apart)
    ids: torch.Tensor  # (n, width): each sequence's own tokens, left-padded
    attention: torch.Tensor  # (n, len(prefix) + width)
    positions: torch.Tensor  # (n, width)


def pack(sequences: Sequence[Sequence[int]], *, prefix_limit: int, pad_id: int) -> Packed:
    """`prefix_limit` caps the shared prefix (e.g. so every sequence keeps a prompt token of its own)."""
    shared = prefix_limit
    for seq in sequences[1:]:
        shared = min(shared, common_prefix_len(sequences[0], seq))
    if shared < MIN_SHARED_PREFIX:
        shared = 0
    n = len(sequences)
    width = max(len(s) for s in sequences) - shared
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    own = torch.zeros((n, width), dtype=torch.long)
    for i, seq in enumerate(sequences):
        rest = seq[shared:]
        ids[i, width - len(rest) :] = torch.tensor(rest, dtype=torch.long)
        own[i, width - len(rest) :] = 1
    attention = torch.cat([torch.ones((n, shared), dtype=torch.long), own], dim=1)
    positions = shared + (own.cumsum(-1) - 1).clamp(min=0)
    return Packed(list(sequences[0][:shared]), ids, attention, positions)
