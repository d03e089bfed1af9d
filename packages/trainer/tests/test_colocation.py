"""vLLM and the trainer taking turns on the same GPUs: the calls happen in the right order around an update and at
start, against a recording stand-in of vLLM's server and a policy that records where its state is (fast; the same
sequences with verl's real worker group and a stand-in that behaves as vLLM's sleep mode are in
test_colocation_verl.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from vllm_stub import RecordingVllm

from agl.learn.transitions import Transition
from agl_trainer.backends import EngineError, UpdateStats
from agl_trainer.config import PolicyConfig
from agl_trainer.engines.colocation import Colocation, TrainerTurnLogprobs, publish_first_weights, update_and_publish
from agl_trainer.engines.publish import RemoteAdapterEngine, RemoteWeightsEngine


class RecordingPolicy:
    """What RemoteAdapterEngine and Colocation use of a policy; each call logged, and where its state is checked."""

    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.on_gpu = True  # a policy starts where it was built
        self.config = PolicyConfig()
        self.agent_adapters: dict[str, str] = {}

    def to_device(self) -> None:
        self.events.append("policy: to_device")
        self.on_gpu = True

    def to_host(self) -> None:
        self.events.append("policy: to_host")
        self.on_gpu = False

    def update(self, transitions: Any) -> UpdateStats:
        assert self.on_gpu, "updated while its state was in host memory"
        self.events.append("policy: update")
        return UpdateStats(transitions=len(transitions))

    def logprobs(self, transitions: Any) -> list[list[float]]:
        assert self.on_gpu, "log-probs computed while its state was in host memory"
        self.events.append("policy: logprobs")
        return [[0.0] for _ in transitions]

    def publish_adapters(self, path: Path) -> None:
        assert self.on_gpu, "published (gathered) while its state was in host memory"
        self.events.append(f"policy: publish {path.name}")
        (path / "adapter").mkdir(parents=True)

    def adapter_folder(self, path: Path, adapter: str | None = None) -> Path:
        return path / "adapter"


def transition() -> Transition:
    return Transition("r", "t", "a", 0, None, [1, 2], [3], [1], [-0.1], None, [], 1.0, advantage=1.0, weight=1.0)


def test_the_gpus_change_hands_in_order_at_start_and_around_each_update(tmp_path: Path) -> None:
    events: list[str] = []
    policy = RecordingPolicy(events)
    with RecordingVllm(events) as vllm:
        sharing = Colocation(vllm.url, policy, level=1)
        sharing.sleep_engine()  # vLLM started first, then put to sleep before the trainer's model loads
        engine = RemoteAdapterEngine(vllm.url, policy, tmp_path / "published")  # type: ignore[arg-type]
        publish_first_weights(engine, sharing)
        assert events == [
            "vllm: POST /sleep?level=1",
            "policy: publish v1",  # written from the trainer while it holds the GPUs
            "policy: to_host",
            "vllm: POST /wake_up?tags=weights",  # verl's order: the weights, then the KV cache
            "vllm: POST /wake_up?tags=kv_cache",
            "vllm: POST /v1/load_lora_adapter",  # given to vLLM once it is awake
        ]
        assert vllm.asleep is False and policy.on_gpu is False
        events.clear()
        stats = update_and_publish(policy, engine, [transition()], sharing)  # type: ignore[arg-type]
        assert stats.transitions == 1
        assert events == [
            "vllm: POST /sleep?level=1",
            "policy: to_device",
            "policy: update",
            "policy: publish v2",
            "policy: to_host",
            "vllm: POST /wake_up?tags=weights",
            "vllm: POST /wake_up?tags=kv_cache",
            "vllm: POST /v1/load_lora_adapter",
        ]
        # the engine check's trainer side runs on the trainer's turn, and hands the GPUs back
        events.clear()
        assert TrainerTurnLogprobs(policy, sharing).logprobs([transition()]) == [[0.0]]
        assert events == [
            "vllm: POST /sleep?level=1",
            "policy: to_device",
            "policy: logprobs",
            "policy: to_host",
            "vllm: POST /wake_up?tags=weights",
            "vllm: POST /wake_up?tags=kv_cache",
        ]
        engine.close()
        sharing.close()


def test_without_colocation_nothing_sleeps_and_nothing_moves(tmp_path: Path) -> None:
    events: list[str] = []
    policy = RecordingPolicy(events)
    with RecordingVllm(events) as vllm:
        engine = RemoteAdapterEngine(vllm.url, policy, tmp_path / "published")  # type: ignore[arg-type]
        update_and_publish(policy, engine, [transition()], None)  # type: ignore[arg-type]
        assert events == ["policy: update", "policy: publish v1", "vllm: POST /v1/load_lora_adapter"]
        engine.close()


def test_a_vllm_without_sleep_mode_is_named(tmp_path: Path) -> None:
    sharing = Colocation("http://127.0.0.1:9/v1", RecordingPolicy([]))  # nothing listens on port 9
    with pytest.raises(EngineError, match="/sleep failed"):
        sharing.sleep_engine()


def test_full_weights_are_reloaded_between_waking_the_weights_and_the_kv_cache(tmp_path: Path) -> None:
    """Level 2 discards vLLM's weights: the new ones are loaded into the woken weight memory before the KV cache
    takes the rest, once (serve does not load them again); a turn that changes no weights sleeps at level 1."""
    events: list[str] = []
    policy = RecordingPolicy(events)
    with RecordingVllm(events) as vllm:
        sharing = Colocation(vllm.url, policy, level=2)
        sharing.sleep_engine()

        def save(target: Path) -> None:
            events.append(f"policy: save {target.name}")
            target.mkdir(parents=True)

        engine = RemoteWeightsEngine(vllm.url, save, tmp_path / "published")
        sharing.restore = engine.reload
        publish_first_weights(engine, sharing)
        assert events == [
            "vllm: POST /sleep?level=2",
            "policy: save v1",
            "policy: to_host",
            "vllm: POST /wake_up?tags=weights",
            "vllm: POST /collective_rpc",  # reload_weights v1, into the woken weight memory
            "vllm: POST /wake_up?tags=kv_cache",
            "vllm: POST /reset_prefix_cache",
        ]
        events.clear()
        with sharing.trainer_turn():
            events.append("policy: checkpoint")
        assert events == [
            "vllm: POST /sleep?level=1",  # vLLM keeps its weights in host memory: nothing to reload
            "policy: to_device",
            "policy: checkpoint",
            "policy: to_host",
            "vllm: POST /wake_up?tags=weights",
            "vllm: POST /wake_up?tags=kv_cache",
        ]
        engine.close()
        sharing.close()


def test_a_level_2_sleep_without_a_way_to_reload_is_refused(tmp_path: Path) -> None:
    policy = RecordingPolicy([])
    with RecordingVllm() as vllm:
        sharing = Colocation(vllm.url, policy, level=2)
        sharing.give_trainer_the_gpus()
        with pytest.raises(EngineError, match="discards its weights"):
            sharing.give_vllm_the_gpus()
        sharing.close()
