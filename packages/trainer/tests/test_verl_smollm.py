"""verl's actor worker trains the bundled SmolLM2-135M (LoRA r16 on q/k/v/o, as `agl train` does): one update
moves the adapter, and the tokens of the answers with a positive advantage become more likely, those with a
negative one less. Without verl this fails, saying what to install, unless AGL_SKIP_VERL_TESTS is set."""

from __future__ import annotations

import importlib.util
import os
import statistics
from collections.abc import Iterator

import pytest
import torch

from agl.learn.transitions import Transition
from agl_trainer.chat_format import render_prompt
from agl_trainer.models import resolve_model
from agl_trainer.policy.packing import common_prefix_len
from agl_trainer.policy.trainer import PolicyConfig

if importlib.util.find_spec("verl") is None and os.environ.get("AGL_SKIP_VERL_TESTS"):
    pytest.skip(
        'AGL_SKIP_VERL_TESTS is set and verl is not installed (pip install "agl-trainer[verl]")',
        allow_module_level=True,
    )

from agl_trainer.verl.backend import VerlPolicy

pytestmark = pytest.mark.slow

QUESTIONS = ["What is 7 times 8?", "Name a colour of the sky.", "What is the capital of France?", "Say hello."]
GOOD = ["7 times 8 is 56.", "The sky is blue.", "The capital of France is Paris.", "Hello!"]
BAD = ["7 times 8 is 65.", "The sky is green.", "The capital of France is Rome.", "Goodbye."]


@pytest.fixture(scope="module")
def smollm() -> Iterator[VerlPolicy]:
    with VerlPolicy(resolve_model("bundled"), PolicyConfig(lr=2e-4)) as policy:
        yield policy


def transitions() -> list[Transition]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("bundled"))
    out = []
    for i, question in enumerate(QUESTIONS):
        prompt = render_prompt(tokenizer, [{"role": "user", "content": question}])
        prompt_ids = list(tokenizer(prompt, add_special_tokens=False).input_ids)
        for answer, advantage in ((GOOD[i], 1.0), (BAD[i], -1.0)):
            response = [
                *tokenizer(answer, add_special_tokens=False).input_ids,
                tokenizer.convert_tokens_to_ids("<|im_end|>"),
            ]
            out.append(
                Transition(
                    rollout_id=f"r{i}-{advantage}",
                    task_id=f"t{i}",
                    attempt_id="a",
                    seq=0,
                    agent_name="solver",
                    prompt_ids=prompt_ids,
                    response_ids=response,
                    response_mask=[1] * len(response),
                    logprobs=None,  # recomputed by the policy
                    model_version=None,
                    call_ids=[f"c{i}{advantage}"],
                    advantage=advantage,
                    temperature=0.7,
                )
            )
    return out


def test_one_update_on_the_bundled_model(smollm: VerlPolicy) -> None:
    batch = transitions()
    before = smollm.logprobs(batch)
    adapter_before = smollm.state_dict_for_engine()
    assert all(float(v.abs().max()) == 0.0 for k, v in adapter_before.items() if "lora_B" in k)  # a fresh adapter

    stats = smollm.update(batch)
    assert stats.recomputed_logprobs == len(batch) and stats.transitions == len(batch)
    assert stats.ratio_mean == pytest.approx(1.0, abs=1e-4)  # on-policy: the recomputed log-probs are the policy's
    assert stats.grad_norm > 0 and stats.tokens == sum(len(t.response_ids) for t in batch)

    adapter_after = smollm.state_dict_for_engine()
    moved = [k for k in adapter_after if not torch.equal(adapter_after[k], adapter_before[k])]
    assert moved and all("lora_" in k for k in moved)

    # Each good answer and its bad twin share tokens ("The capital of France is" … ".<|im_end|>"), which the
    # update pushes up and down at once: the advantage decides the direction only of the tokens where the two
    # differ ("Paris" / "Rome"). Over whole answers, "… is Paris." measured -0.001 to -0.003 in five runs of
    # one update while its "Paris" rose, and "… is 56." -0.003 after three updates.
    after = smollm.logprobs(batch)
    for i in range(0, len(batch), 2):
        good, bad = batch[i].response_ids, batch[i + 1].response_ids
        head = common_prefix_len(good, bad)
        tail = common_prefix_len(good[head:][::-1], bad[head:][::-1])
        for k in (i, i + 1):
            own = slice(head, len(batch[k].response_ids) - tail)
            delta = statistics.mean(after[k][own]) - statistics.mean(before[k][own])
            assert delta * batch[k].advantage > 0, (batch[k].call_ids, batch[k].advantage, delta)
