"""`--per-agent-policies` with verl: one LoRA policy per selected agent on the shared base model.

verl's actor trains one adapter, so each agent gets an actor of its own (`VerlPolicy`, its own worker group and
optimizer). A transition goes to its agent's actor only, so an agent's adapter changes only on its own agent's
calls; the engine serves each adapter under its own name (`policy-<agent>`), and the proxy routes each agent's calls
to it, as with agl's own trainer. Each actor takes `trainer_workers` ranks: on GPUs, agents × trainer_workers GPUs.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agl.learn.transitions import Transition
from agl_trainer.backends import UpdateStats
from agl_trainer.verl.backend import VerlPolicy


class PerAgentVerlPolicy:
    """The policy backend over one `VerlPolicy` per adapter; `make(adapter)` builds each."""

    def __init__(self, agent_adapters: Mapping[str, str], make: Callable[[str], VerlPolicy]) -> None:
        if not agent_adapters:
            raise ValueError("per-agent policies need the agents named")
        self.agent_adapters = dict(agent_adapters)
        self.policies: dict[str, VerlPolicy] = {}
        try:
            for adapter in sorted(set(self.agent_adapters.values())):
                self.policies[adapter] = make(adapter)
        except BaseException:
            self.close()
            raise
        first = next(iter(self.policies.values()))
        self.config = first.config
        self.device = first.device

    def _by_adapter(self, transitions: Sequence[Transition]) -> dict[str, list[int]]:
        groups: dict[str, list[int]] = defaultdict(list)
        for i, t in enumerate(transitions):
            adapter = self.agent_adapters.get(t.agent_name or "")
            if adapter is None:
                raise ValueError(
                    f"transition {t.call_ids} comes from agent {t.agent_name!r}, which has no policy of its own "
                    f"(policies: {sorted(self.agent_adapters)}); select only those agents for training"
                )
            groups[adapter].append(i)
        return groups

    def logprobs(self, transitions: Sequence[Transition]) -> list[list[float]]:
        out: list[list[float]] = [[] for _ in transitions]
        for adapter, rows in self._by_adapter(transitions).items():
            for i, values in zip(rows, self.policies[adapter].logprobs([transitions[i] for i in rows]), strict=True):
                out[i] = values
        return out

    def update(self, transitions: Sequence[Transition]) -> UpdateStats:
        """Each agent's transitions update its own actor; the statistics are summed, the gradient norm is the
        largest, and each agent's own are kept (`grad_norm/<agent>`, `transitions/<agent>`)."""
        total = UpdateStats(transitions=len(transitions))
        agents = {adapter: agent for agent, adapter in self.agent_adapters.items()}
        norms = []
        groups = self._by_adapter(transitions)
        for adapter in sorted(groups):
            stats = self.policies[adapter].update([transitions[i] for i in groups[adapter]])
            total.loss += stats.loss
            total.pg_loss += stats.pg_loss
            total.tokens += stats.tokens
            total.micro_batches += stats.micro_batches
            total.skipped_zero_advantage += stats.skipped_zero_advantage
            total.recomputed_logprobs += stats.recomputed_logprobs
            weight = max(stats.tokens, 0)
            for name in ("kl", "clip_fraction", "ratio_mean"):  # token means: weighted by each agent's tokens
                setattr(total, name, getattr(total, name) + getattr(stats, name) * weight)
            norms.append(stats.grad_norm)
            total.extra[f"grad_norm/{agents[adapter]}"] = stats.grad_norm
            total.extra[f"transitions/{agents[adapter]}"] = float(len(groups[adapter]))
        if total.tokens:
            for name in ("kl", "clip_fraction", "ratio_mean"):
                setattr(total, name, getattr(total, name) / total.tokens)
        total.grad_norm = max(norms, default=0.0)
        return total

    # ------------------------------------------------------------------------------------------ weights out

    def _folder(self, path: str | os.PathLike[str], adapter: str) -> Path:
        return Path(path) / "agents" / adapter

    def adapter_folder(self, path: str | os.PathLike[str], adapter: str | None = None) -> Path:
        """Where `save(path)` puts an agent's adapter (a peft folder, what vLLM's load_lora_adapter reads)."""
        if adapter is None or adapter not in self.policies:
            raise ValueError(f"no policy named {adapter!r} (policies: {sorted(self.policies)})")
        return self.policies[adapter].adapter_folder(self._folder(path, adapter))

    def publish_adapters(self, path: str | os.PathLike[str]) -> None:
        for adapter, policy in self.policies.items():
            policy.publish_adapters(self._folder(path, adapter))

    def save(self, path: str | os.PathLike[str]) -> None:
        for adapter, policy in self.policies.items():
            policy.save(self._folder(path, adapter))

    def load(self, path: str | os.PathLike[str]) -> None:
        for adapter, policy in self.policies.items():
            policy.load(self._folder(path, adapter))

    def load_into(self, model: Any) -> None:
        """Each agent's adapter into the local model's adapter of the same name (the embedded engine's)."""
        for adapter, policy in self.policies.items():
            policy.load_into(model, adapter=adapter)

    def to_device(self) -> None:
        for policy in self.policies.values():
            policy.to_device()

    def to_host(self) -> None:
        for policy in self.policies.values():
            policy.to_host()

    def __enter__(self) -> PerAgentVerlPolicy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        # the first actor started the local Ray (and stops it when closed): it goes last
        for policy in reversed(list(self.policies.values())):
            policy.close()
