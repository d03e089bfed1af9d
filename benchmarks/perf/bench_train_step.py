"""One GRPO step, agl's embedded engine + policy trainer against TRL's `GRPOTrainer`, in the same run.

Same model (the bundled SmolLM2-135M-Instruct, fp32 on CPU), same LoRA (r 16 on q/k/v/o, lr 3e-4, no KL),
same batch (8 prompts × 4 completions, at most 48 new tokens, temperature 0.7), same prompt text (the
calculator agent's first turn, rendered once by agl's chat format and given to both as plain text) and the
same reward function. A step is generation + rewards + advantages + one optimizer update; each side runs two
steps and the second (warm) one is reported. TRL is installed by `make bench` (requirements-bench.txt).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import report

from agl.learn.credit import assign_credit
from agl.learn.transitions import Episode, Transition
from agl_trainer.chat_format import parse_answer, render_prompt
from agl_trainer.engines.embedded import Engine, GenerationRequest
from agl_trainer.examples import calculator
from agl_trainer.models import load_model, resolve_model
from agl_trainer.policy.trainer import PolicyConfig, PolicyTrainer, lora_config, wrap_lora

PROMPTS = 8
GROUP = 4
MAX_NEW = 48
TEMPERATURE = 0.7
LR = 3e-4
STEPS = 2  # the last (warm) one is reported


def reward(text: str, answer: float) -> float:
    """1 for a calculator call whose expression evaluates to the answer, else 0 (the same for both sides)."""
    calls = parse_answer(text, [calculator.CALCULATOR]).tool_calls
    if not calls:
        return 0.0
    try:
        value = calculator.calculate(str(json.loads(calls[0]["function"]["arguments"])["expression"]))
    except (ValueError, KeyError, TypeError, SyntaxError, ZeroDivisionError, json.JSONDecodeError):
        return 0.0
    return 1.0 if abs(value - answer) < 1e-6 else 0.0


def batch(tokenizer: Any) -> list[tuple[str, float]]:
    out = []
    for task in calculator.train_tasks()[:PROMPTS]:
        messages = calculator.first_turn(task["question"])
        out.append((render_prompt(tokenizer, messages, [calculator.CALCULATOR]), float(task["answer"])))
    return out


def agl_steps(prompts: list[tuple[str, float]], steps: int | None = None) -> list[dict[str, float]]:
    model, tokenizer = load_model(resolve_model("bundled"), device="cpu")
    config = PolicyConfig(lr=LR)
    model = wrap_lora(model, config)
    policy = PolicyTrainer(model, config, pad_id=tokenizer.pad_token_id)
    engine = Engine(model, tokenizer, max_batch=PROMPTS * GROUP).start()
    steps = STEPS if steps is None else steps
    timings = []
    try:
        for step in range(steps):
            t0 = time.perf_counter()
            requests = []
            for i, (text, _) in enumerate(prompts):
                ids = list(tokenizer(text, add_special_tokens=False).input_ids)
                requests += [
                    GenerationRequest(
                        ids, max_tokens=MAX_NEW, temperature=TEMPERATURE, seed=step * 1000 + i * GROUP + g
                    )
                    for g in range(GROUP)
                ]
            results = engine.generate_many(requests)
            t_gen = time.perf_counter() - t0
            episodes = []
            for k, (request, result) in enumerate(zip(requests, results, strict=True)):
                text_index = k // GROUP
                t = Transition(
                    rollout_id=f"r{k}",
                    task_id=f"t{text_index}",
                    attempt_id="a",
                    seq=0,
                    agent_name="solver",
                    prompt_ids=request.prompt_ids,
                    response_ids=result.token_ids,
                    response_mask=[1] * len(result.token_ids),
                    logprobs=result.logprobs,
                    model_version=None,
                    call_ids=[f"c{k}"],
                    reward=reward(result.text, prompts[text_index][1]),
                )
                episodes.append(Episode(t.rollout_id, t.task_id, [t], t.reward, []))
            assign_credit(episodes, "grpo")
            t1 = time.perf_counter()
            with engine.lock:
                stats = policy.update([ep.transitions[0] for ep in episodes])
                engine.weights_changed()
            t_update = time.perf_counter() - t1
            timings.append(
                {
                    "generate_s": t_gen,
                    "update_s": t_update,
                    "step_s": time.perf_counter() - t0,
                    "reward": statistics.mean(ep.total_reward for ep in episodes),
                    "trained_transitions": stats.transitions - stats.skipped_zero_advantage,
                }
            )
    finally:
        engine.close()
    return timings


# Where `make bench` puts TRL: a folder of its own, since TRL in the trainer's environment breaks verl (Makefile)
TRL_DIR = Path(__file__).resolve().parents[2] / ".venv-trl"


def trl_steps(prompts: list[tuple[str, float]], steps: int | None = None) -> list[float]:
    if TRL_DIR.is_dir() and str(TRL_DIR) not in sys.path:
        sys.path.append(str(TRL_DIR))  # after site-packages: only TRL itself comes from there
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    steps = STEPS if steps is None else steps
    model, tokenizer = load_model(resolve_model("bundled"), device="cpu")
    answers = {text: answer for text, answer in prompts}

    def reward_fn(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
        return [reward(c, answers[p]) for p, c in zip(prompts, completions, strict=True)]

    durations: list[float] = []

    class Clock(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            self.t0 = time.perf_counter()

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            durations.append(time.perf_counter() - self.t0)

    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=PROMPTS * GROUP,
            num_generations=GROUP,
            max_completion_length=MAX_NEW,
            temperature=TEMPERATURE,
            learning_rate=LR,
            max_steps=steps,
            beta=0.0,
            use_cpu=True,
            bf16=False,
            report_to="none",
            save_strategy="no",
            logging_steps=1,
            seed=0,
        )
        lora = lora_config(PolicyConfig(lr=LR))  # the very LoRA agl trains
        dataset = Dataset.from_list([{"prompt": text} for text, _ in prompts] * steps)
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward_fn,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=lora,
            callbacks=[Clock()],
        )
        trainer.train()
    return durations


def main() -> dict[str, Any]:
    _, tokenizer = load_model(resolve_model("bundled"), device="cpu")
    prompts = batch(tokenizer)
    ours = agl_steps(prompts)
    theirs = trl_steps(prompts)
    rows: dict[str, Any] = {
        "batch": f"{PROMPTS} prompts × {GROUP} completions, ≤ {MAX_NEW} new tokens, T {TEMPERATURE}",
        "prompt tokens": len(tokenizer(prompts[0][0], add_special_tokens=False).input_ids),
        "agl: step s (warm)": ours[-1]["step_s"],
        "agl: generation s": ours[-1]["generate_s"],
        "agl: update s": ours[-1]["update_s"],
        "agl: transitions trained": ours[-1]["trained_transitions"],
        "TRL GRPOTrainer: step s (warm)": theirs[-1],
        "TRL / agl step time": theirs[-1] / ours[-1]["step_s"],
    }
    rows["meets target"] = True  # a comparison, not a target: the ratio is the result
    report("train_step_vs_trl", rows)
    return rows


def smoke() -> None:
    """`make bench-smoke`: that this script runs, at a small size (the numbers are not judged)."""
    global PROMPTS, GROUP, MAX_NEW, STEPS
    # read by batch(), agl_steps() and trl_steps() when they run; one step each: TRL's took 256 s beside CI's suite
    PROMPTS, GROUP, MAX_NEW, STEPS = 2, 2, 8, 1
    main()


if __name__ == "__main__":
    main()
