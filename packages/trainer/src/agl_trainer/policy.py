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

One policy per agent: with `agent_adapters` ({agent name: LoRA adapter name}) each agent's transitions train
only its own adapter on the shared base model, with its own optimizer; the loss above is then normalised per
agent (Σ over that agent's transitions), so an agent that makes many calls does not scale another's step.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
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


def wrap_lora(model: Any, config: PolicyConfig, adapters: Sequence[str] = ("default",)) -> Any:
    """The model with fresh LoRA adapters (peft), one per name; the base weights are frozen."""
    from peft import get_peft_model

    if not adapters:
        raise ValueError("wrap_lora needs at least one adapter name")
    peft_model = get_peft_model(model, lora_config(config), adapter_name=adapters[0])
    for name in adapters[1:]:
        peft_model.add_adapter(name, lora_config(config))
    return peft_model


def adapter_name(agent: str) -> str:
    """The LoRA adapter (and served model) name of an agent's policy: peft names may not hold dots, and the name
    also becomes a folder of the checkpoint, so anything but letters, digits, `_` and `-` becomes `_`."""
    return "policy-" + re.sub(r"[^A-Za-z0-9_-]+", "_", agent)


def agent_adapters(agents: Sequence[str]) -> dict[str, str]:
    """{agent: adapter name} for one policy per agent; refuses names that would share an adapter."""
    out = {a: adapter_name(a) for a in sorted(agents)}
    clashes = [a for a in out if list(out.values()).count(out[a]) > 1]
    if clashes:
        raise ValueError(f"agents {clashes} would share the adapter {out[clashes[0]]!r}: rename one of them")
    return out


class PolicyTrainer:
    """Computes log-probs and applies updates to `model` (a peft model when LoRA is on)."""

    def __init__(
        self, model: Any, config: PolicyConfig, *, pad_id: int, agent_adapters: Mapping[str, str] | None = None
    ) -> None:
        self.model = model
        self.config = config
        self.pad_id = pad_id
        self.device = next(model.parameters()).device
        self.agent_adapters = dict(agent_adapters or {})
        if config.kl_coef > 0 and not config.lora:
            raise ValueError("kl_coef > 0 needs LoRA (the reference is the base model with the adapter off)")
        if self.agent_adapters and not config.lora:
            raise ValueError("one policy per agent needs LoRA (each agent trains its own adapter)")
        # the trained parameters, per adapter (None: the single policy, whatever is trainable)
        self.params: dict[str | None, list[torch.nn.Parameter]] = {}
        if self.agent_adapters:
            for adapter in dict.fromkeys(self.agent_adapters.values()):
                marker = f".{adapter}."
                self.params[adapter] = [p for n, p in model.named_parameters() if marker in n]
                if not self.params[adapter]:
                    raise ValueError(f"the model has no LoRA adapter named {adapter!r}")
        else:
            self.params[None] = [p for p in model.parameters() if p.requires_grad]
            if not self.params[None]:
                raise ValueError("the model has no trainable parameters")
        self.optimizers = {
            adapter: torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
            for adapter, params in self.params.items()
        }
        self.steps = 0

    def _by_adapter(self, transitions: Sequence[Transition]) -> dict[str | None, list[Transition]]:
        if not self.agent_adapters:
            return {None: list(transitions)}
        groups: dict[str | None, list[Transition]] = defaultdict(list)
        for t in transitions:
            adapter = self.agent_adapters.get(t.agent_name or "")
            if adapter is None:
                raise ValueError(
                    f"transition {t.call_ids} comes from agent {t.agent_name!r}, which has no policy of its own "
                    f"(policies: {sorted(self.agent_adapters)}); select only those agents for training"
                )
            groups[adapter].append(t)
        return groups

    def _activate(self, adapter: str | None) -> None:
        if adapter is not None:
            self.model.set_adapter(adapter)
            for p in self.params[adapter]:
                p.requires_grad_(True)

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
        """The current policy's log-probs of each transition's response tokens (each agent's own policy)."""
        self.model.eval()
        out: dict[int, list[float]] = {}
        for adapter, group in self._by_adapter(transitions).items():
            self._activate(adapter)
            for batch in self._micro_batches(group):
                x = self._tensors(batch)
                lp = self._response_logprobs(self.model, x)
                for i, t in enumerate(batch):
                    out[id(t)] = lp[i, lp.shape[1] - len(t.response_ids) :].tolist()
        return [out[id(t)] for t in transitions]

    def update(self, transitions: Sequence[Transition]) -> UpdateStats:
        """One optimizer step per policy on `transitions` (gradients accumulated over micro-batches)."""
        stats = UpdateStats(transitions=len(transitions))
        useful = [t for t in transitions if t.advantage != 0.0 and t.weight > 0]
        stats.skipped_zero_advantage = len(transitions) - len(useful)
        for t in useful:
            if t.logprobs is None:
                raise ValueError(f"transition {t.call_ids} has no behaviour log-probs; recompute them first")
        groups = self._by_adapter(useful) if useful else {}
        sums = {"loss": 0.0, "pg": 0.0, "kl": 0.0, "clipped": 0.0, "ratio": 0.0, "tokens": 0.0}
        norms: dict[str | None, float] = {}
        self.model.train()
        for adapter, group in groups.items():
            self._activate(adapter)
            norms[adapter] = self._step(adapter, group, sums, stats)
        self.model.eval()
        if not groups:
            return stats
        self.steps += 1
        tokens = max(sums["tokens"], 1.0)
        stats.loss, stats.pg_loss = sums["loss"], sums["pg"]
        stats.kl, stats.clip_fraction, stats.ratio_mean = (
            sums["kl"] / tokens,
            sums["clipped"] / tokens,
            sums["ratio"] / tokens,
        )
        finite = [n for n in norms.values() if math.isfinite(n)]
        stats.grad_norm = max(finite) if len(finite) == len(norms) else float("nan")
        stats.tokens = int(sums["tokens"])
        if self.agent_adapters:
            for agent, adapter in self.agent_adapters.items():
                stats.extra[f"grad_norm/{agent}"] = norms.get(adapter, 0.0)
                stats.extra[f"transitions/{agent}"] = float(len(groups.get(adapter, [])))
        return stats

    def _step(self, adapter: str | None, useful: list[Transition], sums: dict[str, float], stats: UpdateStats) -> float:
        """Accumulate the loss of one policy's transitions and step its optimizer; returns the gradient norm."""
        total_weight = sum(t.weight for t in useful)
        cfg = self.config
        optimizer = self.optimizers[adapter]
        optimizer.zero_grad(set_to_none=True)
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
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params[adapter], cfg.max_grad_norm))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return grad_norm if math.isfinite(grad_norm) else float("nan")

    # ------------------------------------------------------------------------------ checkpoints

    def adapter_folder(self, path: str | Path, adapter: str | None = None) -> Path:
        """Where `save(path)` puts an adapter: peft writes `default` at the top, any other name in a subfolder."""
        root = Path(path) / "adapter"
        return root if adapter in (None, "default") else root / adapter

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        if hasattr(self.model, "save_pretrained") and self.config.lora:
            self.model.save_pretrained(path / "adapter")
        else:
            torch.save({k: v for k, v in self.model.state_dict().items()}, path / "model.pt")
        optimizers = {str(k): o.state_dict() for k, o in self.optimizers.items()}
        torch.save({"optimizers": optimizers, "steps": self.steps}, path / "trainer.pt")

    def load(self, path: str | Path) -> None:
        path = Path(path)
        if self.config.lora:
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file

            names = list(self.params) if self.agent_adapters else [getattr(self.model, "active_adapter", "default")]
            for name in names:
                weights = load_file(str(self.adapter_folder(path, name) / "adapter_model.safetensors"))
                set_peft_model_state_dict(self.model, weights, adapter_name=name or "default")
        else:
            self.model.load_state_dict(torch.load(path / "model.pt", map_location=self.device))
        state = torch.load(path / "trainer.pt", map_location=self.device, weights_only=False)
        for key, optimizer in self.optimizers.items():
            optimizer.load_state_dict(state["optimizers"][str(key)])
        self.steps = int(state["steps"])
