"""The trainer's two moving parts, as small interfaces, so that other implementations plug in beside the
embedded ones: a vLLM server as the inference backend, verl (Ray, many GPUs) as the policy backend.

- An inference backend serves the current policy behind an OpenAI-compatible URL that returns exact token ids
  and log-probs (what `agl serve --upstream` forwards to), and is told when the weights changed.
- A policy backend computes log-probs of transitions and applies an update to a batch of them, and saves and
  restores its state.

`agl_trainer.engine.Engine` (+ `serving.EngineServer`) and `agl_trainer.policy.PolicyTrainer` are the embedded
implementations; the training loop only needs what is written here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import httpx

from agl.transitions import Transition
from agl_trainer.policy import PolicyTrainer, UpdateStats


@runtime_checkable
class InferenceBackend(Protocol):
    def weights_changed(self) -> None:
        """The policy's weights changed: serve the new ones from now on (and drop anything cached)."""

    def close(self) -> None: ...


@runtime_checkable
class PolicyBackend(Protocol):
    def logprobs(self, transitions: Sequence[Transition]) -> list[list[float]]:
        """The current policy's log-probs of each transition's response tokens."""

    def update(self, transitions: Sequence[Transition]) -> UpdateStats:
        """One optimizer step on transitions that carry advantages and weights (from `agl.credit`)."""

    def save(self, path: str | Path) -> None: ...

    def load(self, path: str | Path) -> None: ...


class RemoteAdapterEngine:
    """An inference backend in another process (`agl engine`, or a vLLM server started with LoRA support and
    `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`) that serves the same base model: after each update the policy's
    adapters are saved under `folder` and loaded there by name through `POST /v1/load_lora_adapter`.

    The folder must be readable by the serving process (same machine or a shared filesystem)."""

    def __init__(self, base_url: str, policy: PolicyTrainer, folder: str | Path, timeout_s: float = 300.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.policy = policy
        self.folder = Path(folder)
        self.version = 0
        self._http = httpx.Client(timeout=timeout_s)

    def adapter_names(self) -> list[str]:
        """The served names: one per agent with per-agent policies, else the single adapter `default`."""
        return sorted(set(self.policy.agent_adapters.values())) or ["default"]

    def weights_changed(self) -> None:
        self.version += 1
        target = self.folder / f"v{self.version}"
        self.policy.save(target)
        for name in self.adapter_names():
            source = self.policy.adapter_folder(target, name)
            resp = self._http.post(
                f"{self.base_url}/load_lora_adapter", json={"lora_name": name, "lora_path": str(source.resolve())}
            )
            if resp.status_code != 200:
                raise RuntimeError(f"{self.base_url} refused adapter {name!r} from {source}: {resp.text[:500]}")

    def close(self) -> None:
        self._http.close()
