"""One policy per agent (separate LoRA adapters on one base model) and new adapter weights loaded into a
separate `agl engine` process while it serves (vLLM's `/v1/load_lora_adapter` route)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from test_policy import sample

from agl_trainer.engines.embedded import BASE_MODEL, Engine, GenerationRequest
from agl_trainer.engines.remote import agl_engine
from agl_trainer.models import load_model
from agl_trainer.policy.trainer import PolicyConfig, PolicyTrainer, agent_adapters, wrap_lora

QUESTION = [{"role": "user", "content": "Say something."}]


def two_agent_policy(tiny_model_dir: Path) -> tuple[PolicyTrainer, Engine, dict[str, str]]:
    model, tokenizer = load_model(tiny_model_dir, device="cpu")
    adapters = agent_adapters(["writer", "checker v2"])
    torch.manual_seed(0)
    model = wrap_lora(model, PolicyConfig(), adapters=list(adapters.values()))
    policy = PolicyTrainer(model, PolicyConfig(lr=5e-2), pad_id=tokenizer.pad_token_id, agent_adapters=adapters)
    engine = Engine(model, tokenizer)
    engine.default_adapter = BASE_MODEL
    return policy, engine.start(), adapters


def weights(policy: PolicyTrainer, adapter: str) -> list[torch.Tensor]:
    return [p.detach().clone() for p in policy.params[adapter]]


def test_adapter_names_are_safe_and_distinct() -> None:
    assert agent_adapters(["writer", "checker v2"]) == {"checker v2": "policy-checker_v2", "writer": "policy-writer"}
    with pytest.raises(ValueError, match="would share the adapter"):
        agent_adapters(["a.b", "a b"])


def test_each_agent_trains_only_its_own_adapter(tiny_model_dir: Path) -> None:
    policy, engine, adapters = two_agent_policy(tiny_model_dir)
    try:
        before = {a: weights(policy, a) for a in adapters.values()}
        batch = [dataclasses.replace(sample(engine, "Hello there", seed=s), agent_name="writer") for s in range(4)]
        # under the engine's lock, as a run updates (its weights_lock): the engine thread may still be leaving the
        # adapter it generated with, which sets the adapters' requires_grad, when the last answer has been handed over
        with engine.lock:
            stats = policy.update(batch)
        assert stats.extra["transitions/writer"] == 4 and stats.extra["transitions/checker v2"] == 0
        assert stats.extra["grad_norm/writer"] > 0
        changed = {
            a: any(not torch.equal(x, y) for x, y in zip(before[a], weights(policy, a), strict=True)) for a in before
        }
        assert changed == {"policy-writer": True, "policy-checker_v2": False}
        stranger = dataclasses.replace(batch[0], agent_name="rewriter")
        with pytest.raises(ValueError, match="'rewriter', which has no policy of its own"), engine.lock:
            policy.update([stranger])
    finally:
        engine.close()


def test_engine_serves_each_adapter_and_the_base_model_by_name(tiny_model_dir: Path) -> None:
    policy, engine, _ = two_agent_policy(tiny_model_dir)
    try:
        batch = [dataclasses.replace(sample(engine, "Hello there", seed=s), agent_name="writer") for s in range(4)]
        with engine.lock:  # as a run updates (see above)
            policy.update(batch)
        engine.weights_changed()
        prompt = batch[0].prompt_ids

        def greedy_logprobs(adapter: str | None) -> list[float]:
            return engine.generate(GenerationRequest(prompt, max_tokens=6, temperature=0.0, adapter=adapter)).logprobs

        trained, untouched, base = (greedy_logprobs(a) for a in ("policy-writer", "policy-checker_v2", BASE_MODEL))
        assert greedy_logprobs(None) == base  # the engine's default here is the base model
        assert untouched == pytest.approx(base, abs=1e-5)  # LoRA B starts at zero: an untrained adapter is the base
        assert trained != pytest.approx(base, abs=1e-3)
    finally:
        engine.close()


# ----------------------------------------------------------------------- a separate engine process


@pytest.fixture
def engine_process(tiny_model_dir: Path, tmp_path: Path) -> Iterator[str]:
    with agl_engine(tiny_model_dir, log_path=tmp_path / "engine.log") as url:
        yield url


def saved_adapter(tiny_model_dir: Path, folder: Path, seed: int) -> tuple[Path, list[float], list[int]]:
    """A LoRA adapter with random (non-zero) weights saved like a checkpoint, and the log-probs it gives to a
    fixed greedy answer, computed in this process."""
    model, tokenizer = load_model(tiny_model_dir, device="cpu")
    torch.manual_seed(seed)
    model = wrap_lora(model, PolicyConfig())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    engine = Engine(model, tokenizer).start()
    try:
        result = engine.generate(GenerationRequest(prompt_ids(tokenizer), max_tokens=6, temperature=0.0))
    finally:
        engine.close()
    PolicyTrainer(model, PolicyConfig(), pad_id=tokenizer.pad_token_id).save(folder)
    return folder / "adapter", result.logprobs, result.token_ids


def prompt_ids(tokenizer: Any) -> list[int]:
    from agl_trainer.chat_format import render_prompt

    return list(tokenizer(render_prompt(tokenizer, QUESTION), add_special_tokens=False).input_ids)


def ask(url: str, model: str) -> dict[str, Any]:
    body = {"model": model, "messages": QUESTION, "max_tokens": 6, "temperature": 0, "logprobs": True}
    resp = httpx.post(f"{url}/chat/completions", json={**body, "return_token_ids": True}, timeout=60)
    resp.raise_for_status()
    choice = resp.json()["choices"][0]
    return {"ids": choice["token_ids"], "logprobs": [e["logprob"] for e in choice["logprobs"]["content"]]}


def test_new_adapter_weights_reach_a_running_engine_process(
    engine_process: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    url = engine_process
    first, first_lp, first_ids = saved_adapter(tiny_model_dir, tmp_path / "v1", seed=1)
    second, second_lp, second_ids = saved_adapter(tiny_model_dir, tmp_path / "v2", seed=2)
    base = ask(url, BASE_MODEL)

    loaded = httpx.post(f"{url}/load_lora_adapter", json={"lora_name": "policy-writer", "lora_path": str(first)})
    assert loaded.status_code == 200 and "loaded" in loaded.text
    models = {m["id"] for m in httpx.get(f"{url}/models").json()["data"]}
    assert {"policy-writer", BASE_MODEL} <= models
    served = ask(url, "policy-writer")
    assert served["ids"] == first_ids and served["logprobs"] == pytest.approx(first_lp, abs=1e-4)
    assert ask(url, BASE_MODEL) == base  # the base model is untouched by the adapter

    # the same name again: the weights are replaced in place, no restart (vLLM's body for that is accepted too)
    body = {"lora_name": "policy-writer", "lora_path": str(second), "load_inplace": True}
    replaced = httpx.post(f"{url}/load_lora_adapter", json=body)
    assert replaced.status_code == 200 and "replaced" in replaced.text
    served = ask(url, "policy-writer")
    assert served["ids"] == second_ids and served["logprobs"] == pytest.approx(second_lp, abs=1e-4)

    bad = [
        (
            "load_lora_adapter",
            {"lora_name": "x", "lora_path": str(tmp_path / "nowhere")},
            "is not a LoRA adapter folder",
        ),
        ("load_lora_adapter", {"lora_name": BASE_MODEL, "lora_path": str(first)}, "reserved"),
        ("load_lora_adapter", {"lora_path": str(first)}, "'lora_name' and 'lora_path'"),
        ("unload_lora_adapter", {"lora_name": "nobody"}, "no adapter named 'nobody'"),
    ]
    for route, body, words in bad:
        resp = httpx.post(f"{url}/{route}", json=body)
        assert resp.status_code == 400 and words in resp.json()["error"]["message"], (route, resp.text)
    assert ask(url, "policy-writer")["ids"] == second_ids  # a refused request changed nothing


def test_remote_engine_backend_publishes_each_update_to_the_engine_process(
    engine_process: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The trainer's policy lives here, the serving engine in another process: after each update the remote
    backend saves the adapter and the engine serves exactly the weights this process has."""
    from agl_trainer.backends import InferenceBackend
    from agl_trainer.engines.publish import RemoteAdapterEngine

    model, tokenizer = load_model(tiny_model_dir, device="cpu")
    torch.manual_seed(0)
    model = wrap_lora(model, PolicyConfig())
    policy = PolicyTrainer(model, PolicyConfig(lr=5e-2), pad_id=tokenizer.pad_token_id)
    local = Engine(model, tokenizer).start()
    remote = RemoteAdapterEngine(engine_process, policy, tmp_path / "published")
    assert isinstance(remote, InferenceBackend)
    try:
        for _ in range(2):
            batch = [sample(local, "Hello there", seed=s) for s in range(4)]
            with local.lock:  # as a run updates (see above)
                policy.update(batch)
            local.weights_changed()
            remote.weights_changed()
            expected = local.generate(GenerationRequest(prompt_ids(tokenizer), max_tokens=6, temperature=0.0))
            served = ask(engine_process, remote.served_name("default"))  # each version under its own name
            assert served["ids"] == expected.token_ids
            assert served["logprobs"] == pytest.approx(expected.logprobs, abs=1e-4)
        assert sorted(p.name for p in (tmp_path / "published").iterdir()) == ["v1", "v2"]
    finally:
        remote.close()
        local.close()
