"""The importance weights of the off-policy correction, one formula for agl's trainer (agl_trainer.policy.trainer, whose
docstring has the objective) and verl's (agl_trainer.verl.backend hands them to verl's loss as
`rollout_is_weights`, which it multiplies the policy-gradient term by, as agl's trainer does).

Per token, w = π_old / μ: π_old the policy before the update (recomputed by the trainer), μ the policy the engine
sampled with (its log-probs). TIS truncates w at the cap; MIS keeps a transition's tokens at weight 1 while the
geometric mean of its weights stays within [1/cap, cap] and leaves the whole transition out otherwise.
"""

from __future__ import annotations

import math

import torch

from agl_trainer.config import PolicyConfig


class ImportanceWeights:
    """The weights of an update's micro-batches, and the statistics its metrics report."""

    def __init__(self, config: PolicyConfig) -> None:
        if config.is_cap is None:
            raise ValueError("importance weights need is_cap (the off-policy correction is off)")
        self.cap = float(config.is_cap)
        self.mode = config.is_mode
        self.tokens = 0.0
        self.total = 0.0
        self.largest = 0.0
        self.truncated = 0.0
        self.transitions = 0
        self.masked = 0

    def add(self, log_w: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The weights to multiply these (transitions × tokens) policy-gradient terms by, from log π_old − log μ
        per token; `mask` is 1 on the tokens the loss sees. Constants: no gradient flows into π_old or μ."""
        with torch.no_grad():
            mask = mask.to(log_w.dtype)
            log_w = log_w.clamp(-20, 20) * mask
            w = torch.exp(log_w)
            seen = mask.sum(1) > 0
            self.tokens += float(mask.sum())
            self.total += float((w * mask).sum())
            if bool(seen.any()):
                self.largest = max(self.largest, float((w * mask).max()))
            self.transitions += int(seen.sum())
            if self.mode == "mis":
                mean_log = log_w.sum(1) / mask.sum(1).clamp(min=1)
                keep = (mean_log.abs() <= math.log(self.cap)).to(w.dtype)
                self.masked += int(((1 - keep) * seen.to(w.dtype)).sum())
                return keep.unsqueeze(1).expand_as(w).clone()
            self.truncated += float(((w > self.cap).to(w.dtype) * mask).sum())
            return torch.clamp(w, max=self.cap)

    def metrics(self) -> dict[str, float]:
        out = {"is_weight_mean": self.total / max(self.tokens, 1.0), "is_weight_max": self.largest}
        if self.mode == "mis":
            out["is_masked_fraction"] = self.masked / max(self.transitions, 1)
        else:
            out["is_truncated_fraction"] = self.truncated / max(self.tokens, 1.0)
        return out
