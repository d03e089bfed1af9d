"""vLLM and the trainer on the same GPUs, taking turns (the plan's colocated layout, agl_trainer.plan.layout).

Both cannot hold a GPU at once: vLLM's weights and KV cache take most of it during rollouts, the trainer's weights,
gradients, optimizer moments and activations during the update. So around every update, in this order:

1. vLLM goes to sleep (`POST /sleep?level=1`: its KV cache is dropped and its weights move to host memory; level 2
   drops the weights too, for full fine-tuning, where they are reloaded anyway);
2. the trainer's state comes back to the GPU (verl's actor: `to("cuda")`, weights, optimizer and gradients);
3. the update;
4. the new weights are written out from the trainer (the adapter folder, or the full model), while it still
   holds them on the GPU: gathering FSDP shards needs them there;
5. the trainer's state goes to host memory;
6. vLLM wakes up (`POST /wake_up`) and is given the new weights (`load_lora_adapter`, or `reload_weights` and a
   prefix-cache reset), then checked as after every publication.

At start the same steps run without the update: vLLM is started first (it refuses to start when less than its
share is free), put to sleep, the trainer's model loaded, the first weights written, the trainer moved off.
Without colocation (the split layout, a CPU, agl's embedded engine) nothing sleeps and nothing moves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import httpx

from agl.transitions import Transition
from agl_trainer.backends import EngineError
from agl_trainer.policy import UpdateStats


class MovablePolicy(Protocol):
    def to_device(self) -> None: ...

    def to_host(self) -> None: ...

    def update(self, transitions: Sequence[Transition]) -> UpdateStats: ...


class StagedEngine(Protocol):
    def stage(self) -> None:
        """Write the policy's new weights where the engine will read them (needs the trainer's weights)."""

    def serve(self) -> None:
        """Make the engine serve the staged weights (needs the engine awake)."""


class Colocation:
    """Puts vLLM to sleep and moves the trainer's state around an update (see the module's docstring)."""

    def __init__(self, root_url: str, policy: MovablePolicy, *, level: int = 1, timeout_s: float = 600.0) -> None:
        self.root = root_url.rstrip("/").removesuffix("/v1")
        self.policy = policy
        self.level = level
        self._http = httpx.Client(timeout=timeout_s)

    def _post(self, route: str, **params: Any) -> None:
        try:
            resp = self._http.post(f"{self.root}{route}", params=params or None)
        except httpx.HTTPError as exc:
            raise EngineError(f"vLLM at {self.root}: {route} failed: {exc}") from exc
        if resp.status_code == 404:
            raise EngineError(
                f"vLLM at {self.root} has no {route}: colocation needs vLLM started with --enable-sleep-mode and "
                "VLLM_SERVER_DEV_MODE=1 (agl train --engine vllm does so on GPUs), or give vLLM GPUs of its own "
                "(--rollout-gpus)"
            )
        if resp.status_code != 200:
            raise EngineError(f"vLLM at {self.root}: {route} answered {resp.status_code}: {resp.text[:300]}")

    def sleep_engine(self) -> None:
        self._post("/sleep", level=self.level)

    def give_trainer_the_gpus(self) -> None:
        self.sleep_engine()
        self.policy.to_device()

    def give_vllm_the_gpus(self) -> None:
        self.policy.to_host()
        self._post("/wake_up")

    @contextmanager
    def trainer_turn(self) -> Iterator[None]:
        """The trainer holds the GPUs inside (a checkpoint, a resume), vLLM again after."""
        self.give_trainer_the_gpus()
        try:
            yield
        finally:
            self.give_vllm_the_gpus()

    def close(self) -> None:
        self._http.close()


def publish_first_weights(engine: StagedEngine, sharing: Colocation | None) -> None:
    """Serve the policy's starting weights: steps 4-6 of the module's docstring (vLLM is asleep, the trainer on
    the GPUs, when `sharing` is given)."""
    engine.stage()
    if sharing is not None:
        sharing.give_vllm_the_gpus()
    engine.serve()


def update_and_publish(
    policy: MovablePolicy,
    engine: StagedEngine,
    transitions: Sequence[Transition],
    sharing: Colocation | None,
    after_update: Callable[[], None] | None = None,
) -> UpdateStats:
    """One update and the publication of its weights, with the GPUs handed over in the order above."""
    if sharing is not None:
        sharing.give_trainer_the_gpus()
    stats = policy.update(transitions)
    if after_update is not None:
        after_update()
    engine.stage()
    if sharing is not None:
        sharing.give_vllm_the_gpus()
    engine.serve()
    return stats


class TrainerTurnLogprobs:
    """A policy whose `logprobs` run on the trainer's turn of the GPUs (vLLM asleep meanwhile): what the engine
    check needs when it compares vLLM's log-probs with the trainer's on colocated GPUs. Everything else is the
    policy's own."""

    def __init__(self, policy: Any, sharing: Colocation) -> None:
        self._policy = policy
        self._sharing = sharing

    def logprobs(self, transitions: Sequence[Transition]) -> list[list[float]]:
        self._sharing.give_trainer_the_gpus()
        try:
            return list(self._policy.logprobs(transitions))
        finally:
            self._sharing.give_vllm_the_gpus()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._policy, name)
