"""agl's policy loss, computed in verl's worker by verl's own functions.

agl's loss (`agl_trainer.policy.trainer`) for transitions i with advantage A_i and weight w_i, over response tokens j:

    loss = Σ_i w_i · mean_j ℓ_ij / Σ_i w_i,   ℓ_ij = −min(r_ij A_i, clip(r_ij, 1 − ε_low, 1 + ε_high) A_i) + β k3_ij

How it maps onto verl (0.9), with N transitions in the batch and c_i = w_i · N / Σ_k w_k:
- the policy term is verl's `ppo_loss` (its "vanilla" clipped-ratio loss) with `loss_agg_mode="seq-mean-token-mean"`
  over the global batch of N sequences, fed the advantages c_i · A_i: since c_i > 0,
  −min(r c_i A_i, clip(r) c_i A_i) = c_i · (−min(r A_i, clip(r) A_i)), and verl's aggregation
  Σ_i mean_j(·) / N turns Σ_i c_i mean_j ℓ_ij / N into Σ_i w_i mean_j ℓ_ij / Σ w — agl's loss, term for term;
- verl's dual clip (`clip_ratio_c`), which agl does not have, is set out of reach (`NO_DUAL_CLIP`);
- the KL term: verl's own `ppo_loss` would aggregate k3 without the weights (Σ_i mean_j k3_ij / N), so this
  function adds it instead, with verl's `kl_penalty(…, "low_var_kl")` and `agg_loss`, each sequence's k3 scaled
  by c_i: β · Σ_i w_i mean_j k3_ij / Σ w, as agl does. (verl's k3 clamps d = log π_ref − log π_θ to ±20 and
  k3 to ≤ 10, agl's does not: they differ only where k3 > 10, i.e. d > 2.6, where verl's gradient is 0.)

Besides verl's metrics it reports agl's, as sums over the tokens the loss sees (`agl/tokens`, `agl/clipped`,
`agl/ratio`, `agl/kl`), scaled like the loss (× the data-parallel size) so that verl's reduction (mean over ranks,
sum over micro-batches) gives the total.

This module runs in the Ray workers (pickled by reference with `functools.partial`); it needs verl.
"""

from __future__ import annotations

from typing import Any

import torch

# verl's lower bound on the ratio for negative advantages (dual-clip PPO); agl's loss has none
NO_DUAL_CLIP = 1e9
SEQ_WEIGHTS = "agl_seq_weights"  # c_i per sequence (see above), used for the KL term


def agl_ppo_loss(
    config: Any,
    model_output: dict[str, Any],
    data: Any,
    dp_group: Any = None,
    *,
    kl_coef: float = 0.0,
    kl_type: str = "low_var_kl",
) -> tuple[torch.Tensor, dict[str, Any]]:
    from verl.trainer.ppo.core_algos import agg_loss, kl_penalty
    from verl.utils.metric import AggregationType, Metric
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import no_padding_2_padding

    loss, metrics = ppo_loss(config, model_output, data, dp_group)
    dp_size = float(data["dp_size"])
    fields = ["response_mask", "old_log_probs", "advantages", SEQ_WEIGHTS]
    if kl_coef > 0:
        fields.append("ref_log_prob")
    padded = data.select(*fields).to_padded_tensor()
    log_prob = no_padding_2_padding(model_output["log_probs"], data)
    mask = padded["response_mask"].to(torch.bool)
    weight = mask.float()

    with torch.no_grad():
        ratio = torch.exp(torch.clamp(log_prob - padded["old_log_probs"], -20.0, 20.0))
        advantages = padded["advantages"]
        low = 1 - config.clip_ratio_low
        high = 1 + config.clip_ratio_high
        # the tokens whose gradient the clip removed: the clipped term is the larger loss (verl's pg_clipfrac)
        clipped = torch.gt(-advantages * torch.clamp(ratio, low, high), -advantages * ratio).float()
        sums = {
            "agl/tokens": weight.sum(),
            "agl/clipped": (clipped * weight).sum(),
            "agl/ratio": (ratio * weight).sum(),
        }

    if kl_coef > 0:
        kld = kl_penalty(logprob=log_prob, ref_logprob=padded["ref_log_prob"], kl_penalty=kl_type)
        per_sequence = padded[SEQ_WEIGHTS].to(kld.dtype).unsqueeze(-1)
        kl_loss = agg_loss(
            loss_mat=kld * per_sequence, loss_mask=mask, loss_agg_mode=config.loss_agg_mode, **config.global_batch_info
        )
        loss = loss + kl_coef * kl_loss
        metrics["agl/kl_loss"] = Metric(value=kl_loss.detach(), aggregation=AggregationType.SUM)
        sums["agl/kl"] = (kld.detach() * weight).sum()
    for key, value in sums.items():
        metrics[key] = Metric(value=float(value) * dp_size, aggregation=AggregationType.SUM)
    # one per forward/backward pass; every rank makes as many (verl's same_micro_num_in_dp)
    metrics["agl/micro_batches"] = Metric(value=1.0, aggregation=AggregationType.SUM)
    return loss, metrics
