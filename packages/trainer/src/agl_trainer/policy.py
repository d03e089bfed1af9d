"""The policy trainer: log-probs of transitions and a clipped policy-gradient update, with LoRA (default) or full
fine-tuning, on the same model object the engine generates with.

Loss, for transition i with advantage A_i and weight w_i (from `agl.credit`), over its response tokens j that
the policy produced (`response_mask` = 1):

    r_ij   = exp(log π_θ(y_ij) − log π_old(y_ij))                    π_old: the engine's log-probs at sampling
    ℓ_ij   = −min(r_ij A_i, clip(r_ij, 1 − ε_low, 1 + ε_high) A_i) + β k3(π_θ, π_ref)_ij
    loss   = Σ_i w_i · mean_j ℓ_ij / Σ_i w_i

k3 is the usual low-variance KL estimator exp(d) − d − 1 with d = log π_ref − log π_θ; the reference is the base
model (the LoRA adapter switched off), so it costs no extra copy. Sequences are left-padded so every response
ends in the last column, and the vocabulary projection runs only over the response columns. The prompt
beginning a micro-batch shares (an agent's system prompt, tools and examples) is computed once per pass.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from agl.transitions import Transition
from agl_trainer.packing import pack


@dataclass
class PolicyConfig:
    lr: float = 2e-4
    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 0.0
    max_grad_norm: float = 1.0
    micro_batch_tokens: int = 16384  # sequence tokens per forward/backward pass; gradients accumulate over passes
    lora: bool = True
    lora_rank: int = 16
    lora_alpha: int = 32
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    weight_decay: float = 0.0


@dataclass
class UpdateStats:
    loss: float = 0.0
    pg_loss: float = 0.0
    kl: float = 0.0
    clip_fraction: float = 0.0
    ratio_mean: float = 0.0
    grad_norm: float = 0.0
    tokens: int = 0
    transitions: int = 0
    micro_batches: int = 0
    skipped_zero_advantage: int = 0
    extra: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, float]:
        out = {k: float(v) for k, v in self.__dict__.items() if k != "extra"}
        return {**out, **self.extra}


def lora_config(config: PolicyConfig) -> Any:
    """The peft `LoraConfig` of a policy config."""
    from peft import LoraConfig

    return LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,
        lora_dropout=0.0,
        target_modules=list(config.lora_targets),
        task_type="CAUSAL_LM",
    )


def wrap_lora(model: Any, config: PolicyConfig, adapter: str = "default") -> Any:
    """The model with a fresh LoRA adapter (peft); the base weights are frozen."""
    from peft import get_peft_model

    return get_peft_model(model, lora_config(config), adapter_name=adapter)


class PolicyTrainer:
    """Computes log-probs and applies updates to `model` (a peft model when LoRA is on)."""

    def __init__(self, model: Any, config: PolicyConfig, *, pad_id: int) -> None:
        self.model = model
        self.config = config
        self.pad_id = pad_id
        self.device = next(model.parameters()).device
        if config.kl_coef > 0 and not config.lora:
            raise ValueError("kl_coef > 0 needs LoRA (the reference is the base model with the adapter off)")
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the model has no trainable parameters")
        self.optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
        self.steps = 0

    # ------------------------------------------------------------------------------------ batching

    def _micro_batches(self, transitions: Sequence[Transition]) -> list[list[Transition]]:
        ordered = sorted(transitions, key=lambda t: t.n_tokens)  # similar lengths together: less padding
        batches: list[list[Transition]] = []
        current: list[Transition] = []
        longest = 0
        for t in ordered:
            longest_if_added = max(longest, t.n_tokens)
            if current and longest_if_added * (len(current) + 1) > self.config.micro_batch_tokens:
                batches.append(current)
                current, longest_if_added = [], t.n_tokens
            current.append(t)
            longest = longest_if_added
        if current:
            batches.append(current)
        return batches

    def _tensors(self, batch: Sequence[Transition]) -> dict[str, Any]:
        """The batch as [shared prefix][left padding][own prompt rest + response], responses ending in the
        last column. The prefix every sequence shares (the agent's system prompt, tools, examples) is run once
        and its keys/values repeated for the batch; gradients still flow through it, so this is exact."""
        seqs = [t.prompt_ids + t.response_ids for t in batch]
        packed = pack(seqs, prefix_limit=min(len(t.prompt_ids) for t in batch) - 1, pad_id=self.pad_id)
        resp = max(len(t.response_ids) for t in batch)
        n = len(batch)
        mask = torch.zeros((n, resp), dtype=torch.float32)
        old = torch.zeros((n, resp), dtype=torch.float32)
        for i, t in enumerate(batch):
            r = len(t.response_ids)
            mask[i, resp - r :] = torch.tensor(t.response_mask, dtype=torch.float32)
            if t.logprobs is not None:
                old[i, resp - r :] = torch.tensor(t.logprobs, dtype=torch.float32)
        ids, attention, positions = packed.ids, packed.attention, packed.positions
        tensors = {"ids": ids, "attention": attention, "positions": positions, "mask": mask, "old": old}
        out: dict[str, Any] = {k: v.to(self.device) for k, v in tensors.items()}
        out["prefix"] = torch.tensor([packed.prefix], dtype=torch.long, device=self.device) if packed.prefix else None
        return out

    def _response_logprobs(self, model: Any, x: dict[str, Any]) -> torch.Tensor:
        """log π(y_j) for the last `resp` columns: logits at column c predict the token at c + 1."""
        resp = x["mask"].shape[1]
        past = None
        if x["prefix"] is not None:
            shared = x["prefix"].shape[1]
            positions = torch.arange(shared, device=self.device).unsqueeze(0)
            past = model(
                input_ids=x["prefix"], position_ids=positions, use_cache=True, logits_to_keep=1
            ).past_key_values
            if x["ids"].shape[0] > 1:
                past.batch_repeat_interleave(x["ids"].shape[0])
        out = model(
            input_ids=x["ids"],
            attention_mask=x["attention"],
            position_ids=x["positions"],
            past_key_values=past,
            use_cache=past is not None,
            logits_to_keep=resp + 1,
        )
        logits = out.logits[:, :-1, :].float()  # the columns before each response token predict it
        targets = x["ids"][:, -resp:]
        return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)

    # ------------------------------------------------------------------------------------ API

    @torch.no_grad()
    def logprobs(self, transitions: Sequence[Transition]) -> list[list[float]]:
        """The current policy's log-probs of each transition's response tokens."""
        self.model.eval()
        out: dict[int, list[float]] = {}
        for batch in self._micro_batches(transitions):
            x = self._tensors(batch)
            lp = self._response_logprobs(self.model, x)
            for i, t in enumerate(batch):
                out[id(t)] = lp[i, lp.shape[1] - len(t.response_ids) :].tolist()
        return [out[id(t)] for t in transitions]

    def update(self, transitions: Sequence[Transition]) -> UpdateStats:
        """One optimizer step on `transitions` (gradients accumulated over micro-batches)."""
        stats = UpdateStats(transitions=len(transitions))
        useful = [t for t in transitions if t.advantage != 0.0 and t.weight > 0]
        stats.skipped_zero_advantage = len(transitions) - len(useful)
        if not useful:
            return stats
        for t in useful:
            if t.logprobs is None:
                raise ValueError(f"transition {t.call_ids} has no behaviour log-probs; recompute them first")
        total_weight = sum(t.weight for t in useful)
        cfg = self.config
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums = {"loss": 0.0, "pg": 0.0, "kl": 0.0, "clipped": 0.0, "ratio": 0.0, "tokens": 0.0}
        for batch in self._micro_batches(useful):
            x = self._tensors(batch)
            new = self._response_logprobs(self.model, x)
            mask = x["mask"]
            advantages = torch.tensor([t.advantage for t in batch], device=self.device).unsqueeze(1)
            weights = torch.tensor([t.weight for t in batch], device=self.device) / total_weight
            log_ratio = (new - x["old"]).clamp(-20, 20)
            ratio = torch.exp(log_ratio)
            unclipped = ratio * advantages
            clipped = torch.clamp(ratio, 1 - cfg.clip_low, 1 + cfg.clip_high) * advantages
            per_token = -torch.minimum(unclipped, clipped)
            kl = torch.zeros_like(per_token)
            if cfg.kl_coef > 0:
                with torch.no_grad(), self.model.disable_adapter():
                    ref = self._response_logprobs(self.model, x)
                d = ref - new
                kl = torch.exp(d) - d - 1
                per_token = per_token + cfg.kl_coef * kl
            counts = mask.sum(1).clamp(min=1)
            per_transition = (per_token * mask).sum(1) / counts
            loss = (per_transition * weights).sum()
            loss.backward()
            with torch.no_grad():
                n_tok = float(mask.sum())
                sums["loss"] += float(loss)
                sums["pg"] += float(((-torch.minimum(unclipped, clipped) * mask).sum(1) / counts * weights).sum())
                sums["kl"] += float((kl * mask).sum())
                sums["clipped"] += float((((ratio - 1).abs() > cfg.clip_low).float() * mask).sum())
                sums["ratio"] += float((ratio * mask).sum())
                sums["tokens"] += n_tok
            stats.micro_batches += 1
        params = [p for p in self.model.parameters() if p.requires_grad]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        self.steps += 1
        tokens = max(sums["tokens"], 1.0)
        stats.loss, stats.pg_loss = sums["loss"], sums["pg"]
        stats.kl, stats.clip_fraction, stats.ratio_mean = (
            sums["kl"] / tokens,
            sums["clipped"] / tokens,
            sums["ratio"] / tokens,
        )
        stats.grad_norm = float(grad_norm) if math.isfinite(float(grad_norm)) else float("nan")
        stats.tokens = int(sums["tokens"])
        return stats

    # ------------------------------------------------------------------------------ checkpoints

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        if hasattr(self.model, "save_pretrained") and self.config.lora:
            self.model.save_pretrained(path / "adapter")
        else:
            torch.save({k: v for k, v in self.model.state_dict().items()}, path / "model.pt")
        torch.save({"optimizer": self.optimizer.state_dict(), "steps": self.steps}, path / "trainer.pt")

    def load(self, path: str | Path) -> None:
        path = Path(path)
        if self.config.lora:
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file

            set_peft_model_state_dict(self.model, load_file(str(path / "adapter" / "adapter_model.safetensors")))
        else:
            self.model.load_state_dict(torch.load(path / "model.pt", map_location=self.device))
        state = torch.load(path / "trainer.pt", map_location=self.device, weights_only=False)
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps = int(state["steps"])
