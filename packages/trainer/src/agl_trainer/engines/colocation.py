"""vLLM and the trainer on the same GPUs, taking turns (the plan's colocated layout, agl_trainer.plan.layout).

Both cannot hold a GPU at once: vLLM's weights and KV cache take most of it during rollouts, the trainer's weights,
gradients, optimizer moments and activations during the update. So around every update, in this order:

1. vLLM goes to sleep (`POST /sleep?level=L`). vLLM 0.32 (`LLM.sleep`, `v1/worker/gpu_worker.py` `Worker.sleep`,
   `device_allocator/sleep_mode_backend.py` `suspend`): level 1 moves the weights to host memory and drops the KV
   cache; level 2 drops both, and the weights must be loaded again after waking. LoRA runs at level 1 (the base
   model stays what it was); full fine-tuning at level 2 around updates, since the weights are replaced anyway;
2. the trainer's state comes back to the GPU (verl's actor: `to("device")`: weights, optimizer and gradients);
3. the update;
4. the new weights are written out from the trainer (the adapter folder, or the full model), while it still
   holds them on the GPU: gathering FSDP shards needs them there;
5. the trainer's state goes to host memory, and every rank empties its CUDA cache (`AglActorWorker.to`);
6. vLLM wakes in verl's order (`ActorRolloutRefWorker.update_weights`, `workers/engine_workers.py`): the weights
   first (`POST /wake_up?tags=weights`); after a level-2 sleep the new full weights are loaded into them now
   (`reload_weights`), before the KV cache takes what is left of the GPU (`POST /wake_up?tags=kv_cache`);
7. vLLM is given the new LoRA adapter (`load_lora_adapter`), or resets its prefix cache after the reload, and the
   served log-probs are checked as after every publication.

A turn of the trainer that changes no weights (the log-prob check, a checkpoint) sleeps at level 1 whatever the
update's level: vLLM gets its own weights back on waking, and no reload from disk is needed.

At start the same steps run without the update: vLLM is started first (it refuses to start when less than its
share is free), put to sleep, the trainer's model loaded, the first weights written, the trainer moved off.
Without colocation (the split layout, a CPU, agl's embedded engine) nothing sleeps and nothing moves. On several
nodes every step that reaches vLLM reaches each node's server at once (agl_trainer.engines.fan_out).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import httpx

from agl.learn.transitions import Transition
from agl_trainer.backends import EngineError, UpdateStats
from agl_trainer.engines.fan_out import each_server, engine_urls, root_of


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
    """Puts vLLM to sleep and moves the trainer's state around an update (see the module's docstring).

    `level`: the sleep level around updates (1 for LoRA, 2 for full fine-tuning). `restore`: after a level-2
    sleep, loads the weights to serve into vLLM's woken (and emptied) weight memory: the engine's `reload`
    (`RemoteWeightsEngine`). `log`: every step appended as it happens ("vllm: sleep level=2", "trainer: to device",
    ...), for tests and for the run's log."""

    def __init__(
        self,
        root_url: str,
        policy: MovablePolicy,
        *,
        level: int = 1,
        restore: Callable[[], None] | None = None,
        timeout_s: float = 600.0,
        log: list[str] | None = None,
        servers: Any = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        if level not in (1, 2):
            raise ValueError(f"vLLM's sleep level is 1 or 2, got {level}")
        self.root = root_of(root_url)
        self.servers = servers  # on a cluster, every node's server (agl_trainer.engines.fleet): all sleep and wake
        self.policy = policy
        self.level = level
        self.restore = restore
        self.log = log if log is not None else []
        self.slept_at: int | None = None  # the level of the sleep vLLM is in now
        self._http = httpx.Client(timeout=timeout_s, headers=headers)  # headers: the servers' key

    def _post(self, route: str, **params: Any) -> None:
        urls = engine_urls(self.root, self.servers)
        each_server(urls, lambda url: self._post_to(root_of(url), route, params), self.servers)

    def _post_to(self, root: str, route: str, params: dict[str, Any]) -> None:
        try:
            resp = self._http.post(f"{root}{route}", params=params or None)
        except httpx.HTTPError as exc:
            raise EngineError(f"vLLM at {root}: {route} failed: {exc}") from exc
        if resp.status_code == 404:
            raise EngineError(
                f"vLLM at {root} has no {route}: colocation needs vLLM started with --enable-sleep-mode and "
                "VLLM_SERVER_DEV_MODE=1 (agl train --engine vllm does so on GPUs), or give vLLM GPUs of its own "
                "(--rollout-gpus)"
            )
        if resp.status_code != 200:
            raise EngineError(f"vLLM at {root}: {route} answered {resp.status_code}: {resp.text[:300]}")

    def sleep_engine(self, level: int | None = None) -> None:
        level = self.level if level is None else level
        self._post("/sleep", level=level)
        self.slept_at = level
        self.log.append(f"vllm: sleep level={level}")

    def give_trainer_the_gpus(self, *, keep_engine_weights: bool = False) -> None:
        """vLLM to sleep (at level 1 when `keep_engine_weights`: a turn that changes no weights), the trainer's
        state onto the GPUs."""
        self.sleep_engine(1 if keep_engine_weights else None)
        self.policy.to_device()
        self.log.append("trainer: to device")

    def give_vllm_the_gpus(self) -> None:
        """The trainer's state to host memory (its ranks' caches emptied), then vLLM awake: weights, the weights a
        level-2 sleep discarded loaded again (`restore`), then the KV cache."""
        self.policy.to_host()
        self.log.append("trainer: to host, cache emptied")
        self._post("/wake_up", tags="weights")
        self.log.append("vllm: wake weights")
        if self.slept_at == 2:
            if self.restore is None:
                raise EngineError(
                    "vLLM slept at level 2, which discards its weights, and nothing was given to load them again "
                    "(Colocation.restore)"
                )
            self.restore()
            self.log.append("vllm: weights reloaded")
        self._post("/wake_up", tags="kv_cache")
        self.log.append("vllm: wake kv_cache")
        self.slept_at = None

    @contextmanager
    def trainer_turn(self) -> Iterator[None]:
        """The trainer holds the GPUs inside for work that changes no weights (a checkpoint, the log-prob check):
        vLLM keeps its weights in host memory meanwhile (level 1) and has them back after."""
        self.give_trainer_the_gpus(keep_engine_weights=True)
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
    """A policy whose `logprobs` run on the trainer's turn of the GPUs (vLLM asleep at level 1 meanwhile, so that
    it serves the same weights after): what the engine check needs when it compares vLLM's log-probs with the
    trainer's on colocated GPUs. Everything else is the policy's own."""

    def __init__(self, policy: Any, sharing: Colocation) -> None:
        self._policy = policy
        self._sharing = sharing

    def logprobs(self, transitions: Sequence[Transition]) -> list[list[float]]:
        with self._sharing.trainer_turn():
            return list(self._policy.logprobs(transitions))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._policy, name)
