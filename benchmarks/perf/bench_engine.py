"""Generation throughput of the embedded engine at 1 and 8 concurrent requests, on the bundled model.

The batching must show: 8 concurrent requests should give several times the tokens/s of one. Two prompt
shapes: a short chat, and the calculator agent's real prompt (system prompt, tool description, two worked
examples: ~400 tokens, the same beginning in every request), where prefix caching matters as much as batching.
Each figure is the median of `repeats` runs, measured in this one process.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from _common import report

from agl_trainer.chat_format import render_prompt
from agl_trainer.engines.embedded import Engine, GenerationRequest
from agl_trainer.examples import calculator
from agl_trainer.models import load_model, resolve_model


def prompts(tokenizer: Any) -> dict[str, list[list[int]]]:
    def ids(messages: list[dict[str, Any]], tools: Any = None) -> list[int]:
        return list(tokenizer(render_prompt(tokenizer, messages, tools), add_special_tokens=False).input_ids)

    questions = [t["question"] for t in calculator.eval_tasks()[:8]]
    return {
        "short chat": [ids([{"role": "user", "content": f"Tell me a fact about the number {i}."}]) for i in range(8)],
        "agent prompt": [ids(calculator.first_turn(q), [calculator.CALCULATOR]) for q in questions],
    }


def measure(engine: Engine, batch: list[list[int]], concurrency: int, max_tokens: int, repeats: int) -> float:
    rates = []
    for r in range(repeats):
        engine.prefix_cache.clear()  # every repeat pays for its prompts: no help from the previous one
        requests = [
            GenerationRequest(list(p), max_tokens=max_tokens, temperature=1.0, seed=r * 100 + i)
            for i, p in enumerate(batch[:concurrency])
        ]
        t0 = time.perf_counter()
        results = engine.generate_many(requests)
        rates.append(sum(len(x.token_ids) for x in results) / (time.perf_counter() - t0))
    return statistics.median(rates)


def main(max_tokens: int = 48, repeats: int = 3) -> dict[str, Any]:
    model, tokenizer = load_model(resolve_model("bundled"))
    engine = Engine(model, tokenizer, max_batch=8, batch_window_s=0.05).start()
    rows: dict[str, Any] = {
        "model": "SmolLM2-135M-Instruct (bundled)",
        "device": str(engine.device),
        "new tokens per request (max)": max_tokens,
    }
    try:
        for name, batch in prompts(tokenizer).items():
            rows[f"{name}: prompt tokens"] = len(batch[0])
            one = measure(engine, batch, 1, max_tokens, repeats)
            eight = measure(engine, batch, 8, max_tokens, repeats)
            rows[f"{name}: 1 request, tokens/s"] = one
            rows[f"{name}: 8 concurrent, tokens/s"] = eight
            rows[f"{name}: speed-up from batching"] = eight / one
    finally:
        engine.close()
    rows["meets target"] = all(v >= 3.0 for k, v in rows.items() if k.endswith("speed-up from batching"))
    report("engine_throughput", rows)
    return rows


def smoke() -> None:
    """`make bench-smoke`: that this script runs, at a small size (the numbers are not judged)."""
    main(max_tokens=4, repeats=1)


if __name__ == "__main__":
    main()
