"""The start-up probe of an engine in another process: log-probs at the sampling temperature pass; temperature-1
log-probs (vLLM's default `raw_logprobs`) and another model's are refused with a message that says why."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from agl.learn.transitions import Transition
from agl_trainer.backends import EngineError
from agl_trainer.chat_format import render_prompt
from agl_trainer.engines.check import PROBE_TEMPERATURE, TOLERANCE, check_served_logprobs
from agl_trainer.models import load_model
from agl_trainer.policy.trainer import PolicyConfig, PolicyTrainer, wrap_lora


def peaked_policy(tiny_model_dir: Path, seed: int) -> tuple[PolicyTrainer, Any]:
    """The tiny random model with sharp next-token distributions (a random model's are nearly uniform, and then
    every temperature gives the same log-probs)."""
    model, tokenizer = load_model(tiny_model_dir, device="cpu")
    torch.manual_seed(seed)
    with torch.no_grad():
        model.get_output_embeddings().weight.normal_(0, 1.0)
        model.get_output_embeddings().weight.mul_(8.0)
    model = wrap_lora(model, PolicyConfig())
    return PolicyTrainer(model, PolicyConfig(), pad_id=tokenizer.pad_token_id), tokenizer


def fake_engine(reporter: PolicyTrainer, tokenizer: Any, temperature: float, noise: float = 0.0) -> httpx.MockTransport:
    """Answers like vLLM with `return_token_ids`: a fixed answer, with `reporter`'s log-probs at `temperature`."""

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        prompt = list(tokenizer(render_prompt(tokenizer, body["messages"]), add_special_tokens=False).input_ids)
        answer = list(tokenizer("Once upon a time a keeper watched the sea", add_special_tokens=False).input_ids)
        t = Transition(
            "r", "t", "a", 0, None, prompt, answer, [1] * len(answer), None, None, [], temperature=temperature
        )
        logprobs = [lp + noise for lp in reporter.logprobs([t])[0]]
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": "..."},
            "token_ids": answer,
            "logprobs": {"content": [{"token": "x", "logprob": lp} for lp in logprobs]},
        }
        return httpx.Response(200, json={"prompt_token_ids": prompt, "choices": [choice]})

    return httpx.MockTransport(handle)


def test_logprobs_at_the_sampling_temperature_pass(tiny_model_dir: Path) -> None:
    policy, tokenizer = peaked_policy(tiny_model_dir, seed=0)
    (result,) = check_served_logprobs(
        "http://engine/v1", policy, [("default@v1", None)], transport=fake_engine(policy, tokenizer, PROBE_TEMPERATURE)
    )
    # the same model's own log-probs: equal up to float32 rounding, which depends on the batch's shape and the CPU's
    # kernels (the probe scores both temperatures in one batch of two, the stand-in one alone: 3.4e-6 apart on an
    # AMD EPYC), far below TOLERANCE; temperature-1 log-probs are far above it
    assert result.mean_abs_diff < 1e-4 and result.mean_abs_diff_t1 > 0.1 and result.separation > 0.1
    # serving in bf16 puts them ~0.01 apart: still the same distribution
    noisy = fake_engine(policy, tokenizer, PROBE_TEMPERATURE, noise=0.5 * TOLERANCE)
    assert check_served_logprobs("http://engine/v1", policy, [("m", None)], transport=noisy)


def test_temperature_1_logprobs_are_refused_naming_the_vllm_flag(tiny_model_dir: Path) -> None:
    policy, tokenizer = peaked_policy(tiny_model_dir, seed=0)
    with pytest.raises(EngineError, match=r"temperature-1 log-probs.*--logprobs-mode processed_logprobs"):
        check_served_logprobs("http://engine/v1", policy, [("m", None)], transport=fake_engine(policy, tokenizer, 1.0))


def test_another_models_logprobs_are_refused(tiny_model_dir: Path) -> None:
    policy, tokenizer = peaked_policy(tiny_model_dir, seed=0)
    other, _ = peaked_policy(tiny_model_dir, seed=1)
    with pytest.raises(EngineError, match=r"differ from the trainer's .* same base model"):
        check_served_logprobs(
            "http://engine/v1", policy, [("m", None)], transport=fake_engine(other, tokenizer, PROBE_TEMPERATURE)
        )


def test_an_engine_without_token_ids_is_refused(tiny_model_dir: Path) -> None:
    policy, _ = peaked_policy(tiny_model_dir, seed=0)
    plain = httpx.MockTransport(
        lambda request: httpx.Response(200, json={"choices": [{"index": 0, "message": {"content": "hi"}}]})
    )
    with pytest.raises(EngineError, match="without token ids"):
        check_served_logprobs("http://engine/v1", policy, [("m", None)], transport=plain)


def test_several_servers_are_checked_in_one_turn_of_the_trainer(tiny_model_dir: Path) -> None:
    """On colocated GPUs each `logprobs` call of the trainer is a turn (every server asleep meanwhile): the check
    after a publication asks each server first and computes the trainer's side once for all of them (it handed
    every GPU over once per server). A server that serves other log-probs is named."""
    from agl_trainer.engines.check import check_servers

    policy, tokenizer = peaked_policy(tiny_model_dir, seed=0)
    good = fake_engine(policy, tokenizer, PROBE_TEMPERATURE)
    t1 = fake_engine(policy, tokenizer, 1.0)
    turns: list[int] = []

    class Turns:
        def logprobs(self, transitions: list[Transition]) -> list[list[float]]:
            turns.append(len(transitions))
            return policy.logprobs(transitions)

    def route(request: httpx.Request) -> httpx.Response:
        return (t1 if request.url.host == "node-c" else good).handle_request(request)

    urls = [f"http://node-{n}/v1" for n in "ab"]
    results = check_servers(urls, Turns(), [("default@v1", None)], transport=httpx.MockTransport(route))  # type: ignore[arg-type]
    assert [url for url, _ in results] == urls and all(r.mean_abs_diff < TOLERANCE for _, r in results)
    assert turns == [4]  # one call: two temperatures for each of the two servers' answers
    with pytest.raises(EngineError, match=r"node-c.*temperature-1"):
        check_servers(
            [*urls, "http://node-c/v1"], Turns(), [("default@v1", None)], transport=httpx.MockTransport(route)
        )  # type: ignore[arg-type]
    assert turns[1:] == [6]
