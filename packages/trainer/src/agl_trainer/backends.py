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

from agl.transitions import Transition
from agl_trainer.policy import UpdateStats


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
