"""The embedded engine: exact ids, batched = single, log-probs that a forward pass reproduces, limits, stops."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from agl_trainer.chat_format import render_prompt
from agl_trainer.engines.embedded import Engine, GenerationRequest


def prompt_ids(tokenizer: Any, text: str) -> list[int]:
    return list(
        tokenizer(render_prompt(tokenizer, [{"role": "user", "content": text}]), add_special_tokens=False).input_ids
    )


QUESTIONS = ["What is 2+3?", "Name a colour.", "Say something much longer than the other questions, please.", "Hi"]


def test_batched_greedy_equals_one_at_a_time(engine: Engine) -> None:
    requests = [GenerationRequest(prompt_ids(engine.tokenizer, q), max_tokens=12, temperature=0) for q in QUESTIONS]
    single = [engine.generate(r) for r in requests]
    batches_before = engine.batches
    batched = engine.generate_many(requests)
    assert engine.batches - batches_before < len(requests)  # they really went together
    assert [r.token_ids for r in batched] == [r.token_ids for r in single]


def test_logprobs_are_the_models_own_for_the_ids_returned(engine: Engine, tiny: Any) -> None:
    model, tokenizer = tiny
    ids = prompt_ids(tokenizer, "Tell me a story.")
    result = engine.generate(GenerationRequest(ids, max_tokens=10, temperature=1.0, seed=7))
    with torch.no_grad():
        logits = model(torch.tensor([ids + result.token_ids])).logits[0]
    expected = torch.log_softmax(logits.float(), -1)[len(ids) - 1 : -1].gather(
        1, torch.tensor(result.token_ids)[:, None]
    )
    assert result.logprobs == pytest.approx(expected[:, 0].tolist(), abs=1e-4)
    assert result.text == tokenizer.decode(result.token_ids, skip_special_tokens=True)


def test_max_tokens_seed_and_stop_strings(engine: Engine) -> None:
    ids = prompt_ids(engine.tokenizer, "Count to ten.")
    a = engine.generate(GenerationRequest(ids, max_tokens=6, temperature=1.0, seed=3))
    b = engine.generate(GenerationRequest(ids, max_tokens=6, temperature=1.0, seed=3))
    assert a.token_ids == b.token_ids and len(a.token_ids) <= 6
    if a.finish_reason == "length":
        assert len(a.token_ids) == 6
    longer = engine.generate(GenerationRequest(ids, max_tokens=24, temperature=1.0, seed=5))
    k = next(i for i, ch in enumerate(longer.text) if i > 0 and not ch.isspace())
    stop = longer.text[k : k + 2]
    stopped = engine.generate(GenerationRequest(ids, max_tokens=24, temperature=1.0, seed=5, stop=[stop]))
    assert stopped.finish_reason == "stop" and stop not in stopped.text
    assert stopped.text == longer.text[: longer.text.find(stop)]
    assert stopped.token_ids == longer.token_ids[: len(stopped.token_ids)]  # up to the token that completed it


def test_bad_requests_are_refused_with_the_reason(engine: Engine) -> None:
    with pytest.raises(ValueError, match="empty prompt"):
        engine.submit(GenerationRequest([]))
    with pytest.raises(ValueError, match="context is"):
        engine.submit(GenerationRequest([1] * (engine.max_context + 1)))
    with pytest.raises(ValueError, match="max_tokens"):
        engine.submit(GenerationRequest([1, 2], max_tokens=0))


def test_the_prefix_cache_is_bounded_by_bytes_and_still_exact(engine: Engine) -> None:
    """Entries are sized by their keys/values; past `max_bytes` the least recently used go, and a cache too
    small for any entry keeps none. Answers do not depend on what the cache holds."""
    from agl_trainer.engines.embedded import cache_bytes

    requests = [GenerationRequest(prompt_ids(engine.tokenizer, q), max_tokens=6, temperature=0) for q in QUESTIONS]
    cache = engine.prefix_cache
    cache.clear()
    unbounded = [r.token_ids for r in engine.generate_many(requests)]
    assert cache.entries, "the shared beginning is cached"
    one = next(iter(cache.entries.values()))[1]
    assert cache.bytes == sum(size for _, size in cache.entries.values()) > 0
    assert cache_bytes(next(iter(cache.entries.values()))[0]) == one
    try:
        cache.clear()
        cache.max_bytes = one - 1  # smaller than any entry: nothing is kept
        assert [r.token_ids for r in engine.generate_many(requests)] == unbounded
        assert not cache.entries and cache.bytes == 0
        cache.max_bytes = one  # room for exactly the shared beginning
        assert [r.token_ids for r in engine.generate_many(requests)] == unbounded
        assert len(cache.entries) == 1 and cache.bytes == one
        cache.put("other", [1, 2, 3], next(iter(cache.entries.values()))[0])  # the newest pushes the oldest out
        assert list(cache.entries) == [("other", (1, 2, 3))] and cache.bytes == one
    finally:
        cache.max_bytes = 256 * 2**20
        cache.clear()
