"""The policy trainer: log-probs of transitions and a clipped policy-gradient update, with LoRA (default) or full
fine-tuning, on the same model object the engine generates with.

Loss, for transition i with advantage A_i and weight w_i (from `agl.learn.credit`), over its response tokens j that
the policy produced (`response_mask` = 1):

    r_ij   = exp(log π_θ(y_ij) − log π_old(y_ij))                    π_old: the engine's log-probs at sampling
    ℓ_ij   = −min(r_ij A_i, clip(r_ij, 1 − ε_low, 1 + ε_high) A_i) + β k3(π_θ, π_ref)_ij
    loss   = Σ_i w_i · mean_j ℓ_ij / Σ_i w_i

π is the distribution the response was sampled from: softmax(logits / T_i) with transition i's sampling
temperature, in π_θ, π_old and π_ref alike (as verl does), so the samples come from the policy being optimised.
k3 is the usual low-variance KL estimator exp(d) − d − 1 with d = log π_ref − log π_θ; the reference is the base
model (the LoRA adapter switched off), so it costs no extra copy. With β > 0, transitions whose advantage is 0
are still trained: their KL term pulls them towards the reference. Sequences are left-padded so every response
ends in the last column, and the vocabulary projection runs only over the response columns.

Memory. The prompt beginning that a policy's transitions share (an agent's system prompt, tools and examples:
most of each sequence) is run once per update, not once per micro-batch: its keys and values become leaves that
every micro-batch reads, their gradients add up over the micro-batches, and one backward pass through the prefix
at the end sends them on (exact: the same sum of gradients). A micro-batch then holds only each sequence's own
tokens, so its memory follows those: `micro_batch_tokens` counts them, and on a CPU a micro-batch is also held to
`CPU_UPDATE_BYTES` of estimated activations (the main job's update took 8.6 GB above the weights before).

Off-policy correction (`is_cap`, decoupled PPO with truncated importance sampling). The engine's log-probs are
those of the behaviour policy μ, which is not the policy being updated when rollouts ran on an older version
(bounded staleness) or when the engine computes in another precision (bf16 against the trainer's fp32). Then
π_old is recomputed by the trainer with the current weights before the update (the proximal policy), the clip
acts on π_θ / π_old, and each token's term is weighted by its importance weight w_ij = π_old(y_ij) / μ(y_ij),
held constant:

    ℓ_ij = −ŵ_ij · min(r_ij A_i, clip(r_ij, 1 − ε_low, 1 + ε_high) A_i) + β k3_ij
    TIS: ŵ_ij = min(w_ij, cap)          MIS: ŵ_ij = 1 if exp(mean_j log w_ij) ∈ [1/cap, cap], else 0 (for all j)

With μ = π_old every w is 1 and this is the objective above. The mean and max weight, and the fraction of tokens
truncated (TIS) or transitions masked (MIS), go into the update's metrics.

One policy per agent: with `agent_adapters` ({agent name: LoRA adapter name}) each agent's transitions train
only its own adapter on the shared base model, with its own optimizer; the loss above is then normalised per
agent (Σ over that agent's transitions), so an agent that makes many calls does not scale another's step.
"""

from __future__ import annotations

import copy
import math
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agl.learn.transitions import Transition, concat_ids
from agl_trainer.backends import UpdateStats
from agl_trainer.config import PolicyConfig as PolicyConfig  # re-exported beside the trainer it configures
from agl_trainer.model_shape import ModelShape, shape_from_config
from agl_trainer.policy.memory import give_back
from agl_trainer.policy.off_policy import ImportanceWeights
from agl_trainer.policy.packing import MIN_SHARED_PREFIX, common_prefix_len, pack

# On a CPU a micro-batch is held to about this many bytes of what its backward pass keeps (see
# `activation_bytes`); on CUDA the token budget alone decides, as the plan sizes it for the GPU.
CPU_UPDATE_BYTES = 384 * 2**20


def activation_bytes(shape: ModelShape, own_tokens: int, response_tokens: int, context: int) -> int:
    """Rough bytes a micro-batch keeps for backward in fp32 (the plan's per-layer count, agl_trainer.plan.memory):
    each own token's values per decoder layer, each response token's vocabulary-sized logits and their fp32
    log-softmax and gradients, and the keys/values of the whole context every sequence attends to."""
    per_token = shape.layers * shape.layer_values_per_token * 4
    logits = shape.vocab * 16
    kv = shape.layers * 2 * shape.kv_dim * 4 * 2  # keys and values, and their gradients
    return own_tokens * per_token + response_tokens * logits + context * kv


@dataclass
class SharedPrefix:
    """The keys/values of a prompt beginning, run once; micro-batches read them through leaf tensors."""

    ids: list[int]
    past: Any  # the prefix pass's own cache object: its layer types (full, sliding window) are kept
    leaves: list[torch.Tensor]  # per layer: keys, values (batch 1), each a leaf that gathers gradients
    outputs: list[torch.Tensor] | None  # the same tensors as the prefix pass produced them (its graph)

    @classmethod
    def run(cls, model: Any, ids: list[int], device: Any, *, grad: bool) -> SharedPrefix:
        x = torch.tensor([ids], dtype=torch.long, device=device)
        positions = torch.arange(len(ids), device=device).unsqueeze(0)
        with torch.set_grad_enabled(grad):
            past = model(input_ids=x, position_ids=positions, use_cache=True, logits_to_keep=1).past_key_values
        outputs = [t for layer in past.layers for t in (layer.keys, layer.values)]
        if not grad:
            return cls(ids, past, outputs, None)
        return cls(ids, past, [t.detach().requires_grad_(True) for t in outputs], outputs)

    def cache(self, n: int) -> Any:
        """A key/value cache of the prefix for a batch of `n` (differentiable with respect to the leaves); the
        prefix's own cache is never changed, so every micro-batch starts from the same one."""
        cache = copy.copy(self.past)
        cache.layers = []
        for i, layer in enumerate(self.past.layers):
            fresh = copy.copy(layer)
            fresh.keys, fresh.values = self.leaves[2 * i], self.leaves[2 * i + 1]
            cache.layers.append(fresh)
        if n > 1:
            cache.batch_repeat_interleave(n)
        return cache

    def backward(self) -> None:
        """Send the gradients the micro-batches left on the leaves through the prefix pass, once."""
        if self.outputs is None:
            return
        pairs = [(out, leaf.grad) for out, leaf in zip(self.outputs, self.leaves, strict=True) if leaf.grad is not None]
        if pairs:
            torch.autograd.backward([out for out, _ in pairs], [g for _, g in pairs])
        self.outputs = None


def shared_prefix_ids(transitions: Sequence[Transition]) -> list[int]:
    """The prompt beginning every transition shares, leaving each at least one prompt token of its own (its logits
    start the response); empty when too short to be worth running apart."""
    first = transitions[0].prompt_ids
    shared = min(len(t.prompt_ids) for t in transitions) - 1
    for t in transitions[1:]:
        shared = min(shared, common_prefix_len(first, t.prompt_ids))
    return [int(i) for i in first[:shared]] if shared >= MIN_SHARED_PREFIX else []


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
        # on a CPU, what micro-batches are sized by besides their tokens (None elsewhere: the budget alone)
        self.shape = shape_from_config(model.config.to_dict()) if self.device.type == "cpu" else None
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

    def _micro_batches(self, transitions: Sequence[Transition], shared: int = 0) -> list[list[Transition]]:
        """Transitions in passes of at most `micro_batch_tokens` own tokens (those after the `shared` prefix, padded
        to the longest), on a CPU also of at most CPU_UPDATE_BYTES of estimated activations."""
        ordered = sorted(transitions, key=lambda t: t.n_tokens)  # similar lengths together: less padding
        batches: list[list[Transition]] = []
        current: list[Transition] = []
        longest = longest_response = 0
        for t in ordered:
            own = max(longest, t.n_tokens - shared)
            response = max(longest_response, len(t.response_ids))
            n = len(current) + 1
            too_big = own * n > self.config.micro_batch_tokens or (
                self.shape is not None
                and activation_bytes(self.shape, own * n, response * n, (own + shared) * n) > CPU_UPDATE_BYTES
            )
            if current and too_big:
                batches.append(current)
                current, own, response = [], t.n_tokens - shared, len(t.response_ids)
            current.append(t)
            longest, longest_response = own, response
        if current:
            batches.append(current)
        return batches

    def _tensors(self, batch: Sequence[Transition], prefix: SharedPrefix | None = None) -> dict[str, Any]:
        """The batch as [shared prefix][left padding][own prompt rest + response], responses ending in the
        last column. The prefix every sequence shares (the agent's system prompt, tools, examples) is run once
        and its keys/values repeated for the batch; gradients still flow through it, so this is exact. With
        `prefix` (run once for the whole update) the batch is laid out after it, and shares nothing more."""
        seqs = [concat_ids(t.prompt_ids, t.response_ids) for t in batch]
        if prefix is not None:
            packed = pack([s[len(prefix.ids) :] for s in seqs], prefix_limit=0, pad_id=self.pad_id)
            shift = len(prefix.ids)
            packed.positions = packed.positions + shift
            packed.attention = torch.cat([torch.ones((len(seqs), shift), dtype=torch.long), packed.attention], dim=1)
        else:
            packed = pack(seqs, prefix_limit=min(len(t.prompt_ids) for t in batch) - 1, pad_id=self.pad_id)
        resp = max(len(t.response_ids) for t in batch)
        n = len(batch)
        mask = torch.zeros((n, resp), dtype=torch.float32)
        for i, t in enumerate(batch):
            mask[i, resp - len(t.response_ids) :] = torch.tensor(t.response_mask, dtype=torch.float32)
        old = self._right_aligned(batch, resp, [t.logprobs for t in batch])
        temperature = torch.tensor([[[t.temperature]] for t in batch], dtype=torch.float32)
        ids, attention, positions = packed.ids, packed.attention, packed.positions
        tensors = {
            "ids": ids,
            "attention": attention,
            "positions": positions,
            "mask": mask,
            "old": old,
            "temperature": temperature,
        }
        out: dict[str, Any] = {k: v.to(self.device) for k, v in tensors.items()}
        out["prefix"] = torch.tensor([packed.prefix], dtype=torch.long, device=self.device) if packed.prefix else None
        return out

    @staticmethod
    def _right_aligned(
        batch: Sequence[Transition], resp: int, values: Sequence[Sequence[float] | None]
    ) -> torch.Tensor:
        """Per-token values of each transition's response, laid out as its response is (ending in the last
        column); zeros where a transition has none."""
        out = torch.zeros((len(batch), resp), dtype=torch.float32)
        for i, (t, v) in enumerate(zip(batch, values, strict=True)):
            if v is not None:
                out[i, resp - len(t.response_ids) :] = torch.tensor(v, dtype=torch.float32)
        return out

    def _response_logprobs(self, model: Any, x: dict[str, Any], prefix: SharedPrefix | None = None) -> torch.Tensor:
        """log π(y_j) for the last `resp` columns: logits at column c predict the token at c + 1."""
        resp = x["mask"].shape[1]
        past = None
        if prefix is not None:
            past = prefix.cache(x["ids"].shape[0])
        elif x["prefix"] is not None:
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
        # the columns before each response token predict it; scaled by the temperature it was sampled at
        logits = out.logits[:, :-1, :].float() / x["temperature"]
        targets = x["ids"][:, -resp:]
        return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)

    # ------------------------------------------------------------------------------------ API

    def to_device(self) -> None:
        """Nothing moves: this trainer's model is also what the process generates or checks with; a plan counts
        its weights as resident while vLLM runs beside it (agl_trainer.plan.build)."""

    def to_host(self) -> None:
        """See `to_device`."""

    @torch.no_grad()
    def logprobs(self, transitions: Sequence[Transition]) -> list[list[float]]:
        """The current policy's log-probs of each transition's response tokens (each agent's own policy)."""
        self.model.eval()
        out: dict[int, list[float]] = {}
        for adapter, group in self._by_adapter(transitions).items():
            self._activate(adapter)
            ids = shared_prefix_ids(group)
            prefix = SharedPrefix.run(self.model, ids, self.device, grad=False) if ids else None
            for batch in self._micro_batches(group, len(ids)):
                x = self._tensors(batch, prefix)
                lp = self._response_logprobs(self.model, x, prefix)
                for i, t in enumerate(batch):
                    out[id(t)] = lp[i, lp.shape[1] - len(t.response_ids) :].tolist()
        return [out[id(t)] for t in transitions]

    def update(self, transitions: Sequence[Transition]) -> UpdateStats:
        """One optimizer step per policy on `transitions` (gradients accumulated over micro-batches)."""
        stats = UpdateStats(transitions=len(transitions))
        # A zero advantage gives no policy gradient, but with a KL term the transition still has a loss.
        keep_zero = self.config.kl_coef > 0
        useful = [t for t in transitions if t.weight > 0 and (keep_zero or t.advantage != 0.0)]
        stats.skipped_zero_advantage = len(transitions) - len(useful)
        missing = [t for t in useful if t.logprobs is None or len(t.logprobs) != len(t.response_ids)]
        if missing:
            for t, lp in zip(missing, self.logprobs(missing), strict=True):
                t.logprobs = lp
            stats.recomputed_logprobs = len(missing)
        groups = self._by_adapter(useful) if useful else {}
        # the proximal policy π_old: the policy as it is before this update (see the module's docstring)
        proximal: dict[int, list[float]] = {}
        if self.config.is_cap is not None and useful:
            proximal = {id(t): lp for t, lp in zip(useful, self.logprobs(useful), strict=True)}
        sums = {"loss": 0.0, "pg": 0.0, "kl": 0.0, "clipped": 0.0, "ratio": 0.0, "tokens": 0.0}
        weights = ImportanceWeights(self.config) if proximal else None
        norms: dict[str | None, float] = {}
        self.model.train()
        for adapter, group in groups.items():
            self._activate(adapter)
            norms[adapter] = self._step(adapter, group, sums, stats, proximal, weights)
        self.model.eval()
        if weights is not None:
            stats.extra.update(weights.metrics())
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

    def _step(
        self,
        adapter: str | None,
        useful: list[Transition],
        sums: dict[str, float],
        stats: UpdateStats,
        proximal: dict[int, list[float]],
        is_weights: ImportanceWeights | None,
    ) -> float:
        """Accumulate the loss of one policy's transitions and step its optimizer; returns the gradient norm.
        With `proximal` log-probs (off-policy correction on), the clip acts on π_θ / π_old and each token's term is
        weighted by π_old / μ, truncated or masked (module docstring)."""
        total_weight = sum(t.weight for t in useful)
        cfg = self.config
        optimizer = self.optimizers[adapter]
        optimizer.zero_grad(set_to_none=True)
        ids = shared_prefix_ids(useful)
        prefix = SharedPrefix.run(self.model, ids, self.device, grad=True) if ids else None
        reference: SharedPrefix | None = None  # the base model's prefix, for the KL term
        if prefix is not None and cfg.kl_coef > 0:
            with self.model.disable_adapter():
                reference = SharedPrefix.run(self.model, ids, self.device, grad=False)
        for batch in self._micro_batches(useful, len(ids)):
            x = self._tensors(batch, prefix)
            new = self._response_logprobs(self.model, x, prefix)
            mask = x["mask"]
            advantages = torch.tensor([t.advantage for t in batch], device=self.device).unsqueeze(1)
            weights = torch.tensor([t.weight for t in batch], device=self.device) / total_weight
            old = x["old"]
            importance: torch.Tensor | None = None
            if is_weights is not None:
                old = self._right_aligned(batch, mask.shape[1], [proximal[id(t)] for t in batch]).to(self.device)
                importance = is_weights.add(old - x["old"], mask)
            log_ratio = (new - old).clamp(-20, 20)
            ratio = torch.exp(log_ratio)
            unclipped = ratio * advantages
            clipped = torch.clamp(ratio, 1 - cfg.clip_low, 1 + cfg.clip_high) * advantages
            pg = -torch.minimum(unclipped, clipped)
            if importance is not None:
                pg = importance * pg
            per_token = pg
            kl = torch.zeros_like(per_token)
            if cfg.kl_coef > 0:
                with torch.no_grad(), self.model.disable_adapter():
                    ref = self._response_logprobs(self.model, x, reference)
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
                sums["pg"] += float(((pg * mask).sum(1) / counts * weights).sum())
                sums["kl"] += float((kl * mask).sum())
                # tokens whose gradient the clip removed: the clipped term is the smaller one and is constant
                clipped_away = ((advantages > 0) & (ratio > 1 + cfg.clip_high)) | (
                    (advantages < 0) & (ratio < 1 - cfg.clip_low)
                )
                sums["clipped"] += float((clipped_away.float() * mask).sum())
                sums["ratio"] += float((ratio * mask).sum())
                sums["tokens"] += n_tok
            stats.micro_batches += 1
            if self.device.type == "cpu":
                give_back()  # this micro-batch's freed activations, before the next one allocates its own
        if prefix is not None:
            prefix.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params[adapter], cfg.max_grad_norm))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return grad_norm if math.isfinite(grad_norm) else float("nan")

    # ------------------------------------------------------------------------------ checkpoints

    def adapter_folder(self, path: str | Path, adapter: str | None = None) -> Path:
        """Where `save(path)` puts an adapter: peft writes `default` at the top, any other name in a subfolder."""
        root = Path(path) / "adapter"
        return root if adapter in (None, "default") else root / adapter

    def publish_adapters(self, path: str | Path) -> None:
        """Only what an engine loads: the LoRA adapters as peft folders (`adapter_folder`), no optimizer state."""
        Path(path).mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(Path(path) / "adapter")

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
