"""The parts of `agl train --plan`: model shapes from config.json, vLLM's tool parser per model family, verl's
settings and their validation by verl's own dataclasses, and the memory estimate against a measured peak."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from agl_trainer.config import PolicyConfig
from agl_trainer.model_shape import ModelShape, read_shape
from agl_trainer.models import resolve_model
from agl_trainer.plan.tool_parsers import tool_parser
from agl_trainer.verl.settings import actor_settings, cuda_profile, parse_overrides, root_config, validate

MODELS = Path(__file__).parent / "data" / "models"
BENCH = Path(__file__).resolve().parents[3] / "benchmarks" / "perf"


@pytest.mark.parametrize(
    ("name", "published"),
    [
        ("Qwen2.5-1.5B-Instruct", 1.54e9),
        ("Llama-3.2-3B-Instruct", 3.21e9),
        ("Qwen2.5-7B-Instruct", 7.62e9),
        ("Llama-3.1-70B-Instruct", 70.6e9),
    ],
)
def test_parameter_counts_from_config_json_match_the_published_ones(name: str, published: float) -> None:
    shape = read_shape(MODELS / name)
    assert abs(shape.params - published) / published < 0.01


def test_the_bundled_model_counts_its_own_parameters() -> None:
    import torch
    from transformers import AutoModelForCausalLM

    path = resolve_model("bundled")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(__import__("transformers").AutoConfig.from_pretrained(path))
    assert read_shape(path).params == sum(p.numel() for p in model.parameters())


def test_a_folder_without_config_json_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        read_shape(tmp_path)


def shape(model_type: str, vocab: int = 32_000) -> ModelShape:
    return ModelShape(model_type, (), 64, 128, 2, 4, 4, 16, vocab, False, 2048, False)


@pytest.mark.parametrize(
    ("model_type", "vocab", "renders_tools", "parser"),
    [
        ("qwen2", 151_936, None, "hermes"),
        ("qwen3", 151_936, True, "hermes"),
        ("llama", 128_256, None, "llama3_json"),  # Llama 3.x
        ("llama", 128_256, True, "llama3_json"),
        ("llama", 49_152, None, "hermes"),  # SmolLM2: a Llama without Llama 3's tool format
        ("llama", 128_256, False, "hermes"),  # a template without tools: served with agl's Hermes template
        ("mistral", 32_768, None, "mistral"),
        ("mixtral", 32_000, None, "mistral"),
        ("llama4", 202_048, None, "llama4_json"),
        ("granite", 49_155, None, "granite"),
        ("phi3", 200_064, None, "phi4_mini_json"),
        ("gpt_bigcode", 49_152, None, "hermes"),  # unknown family
    ],
)
def test_the_tool_parser_follows_the_model_family(
    model_type: str, vocab: int, renders_tools: bool | None, parser: str
) -> None:
    assert tool_parser(shape(model_type, vocab), template_renders_tools=renders_tools).parser == parser


def test_the_planned_models_get_their_families_parsers() -> None:
    assert tool_parser(read_shape(MODELS / "Llama-3.2-3B-Instruct")).parser == "llama3_json"
    assert tool_parser(read_shape(MODELS / "Qwen2.5-7B-Instruct")).parser == "hermes"
    assert tool_parser(read_shape(resolve_model("bundled"))).parser == "hermes"


# ------------------------------------------------------------------------------------------------ verl settings

needs_verl = pytest.mark.skipif(importlib.util.find_spec("verl") is None, reason="verl is not installed")


def test_overrides_are_typed_and_malformed_ones_named() -> None:
    assert parse_overrides(["actor.optim.lr=1e-6", "actor.optim.betas=[0.9, 0.95]", "rollout.n=2"]) == {
        "actor.optim.lr": 1e-6,
        "actor.optim.betas": [0.9, 0.95],
        "rollout.n": 2,
    }
    assert parse_overrides(["actor_rollout_ref.actor.shuffle=true"]) == {"actor.shuffle": True}
    for bad in ("actor.optim.lr", "=3", "actor..lr=1"):
        with pytest.raises(ValueError, match="KEY=VALUE"):
            parse_overrides([bad])


@needs_verl
def test_the_cuda_settings_pass_verls_dataclasses_and_bad_overrides_do_not() -> None:
    settings = actor_settings(
        MODELS / "Llama-3.2-3B-Instruct", PolicyConfig(), cuda_profile(8192, lora=True, flash_attention=True)
    )
    root = root_config(settings, parse_overrides(["actor.optim.betas=[0.9,0.95]"]))
    validate(root, load_tokenizer=False)
    actor = root.actor_rollout_ref.actor
    # LoRA: the frozen base loaded in bf16 (the adapter is fp32: test_colocation_verl); full fine-tuning: fp32 master
    assert actor.fsdp_config.mixed_precision.param_dtype == "bf16" and actor.fsdp_config.model_dtype == "bf16"
    full = actor_settings(
        MODELS / "Llama-3.2-3B-Instruct", PolicyConfig(lora=False), cuda_profile(8192, lora=False, flash_attention=True)
    )
    assert full["actor.fsdp_config.model_dtype"] == "fp32"
    assert root.actor_rollout_ref.model.enable_gradient_checkpointing is True
    assert root.actor_rollout_ref.model.use_remove_padding is True and actor.ppo_max_token_len_per_gpu == 8192
    with pytest.raises(ValueError, match=r"does not have: actor\.optim\.nope"):
        root_config(settings, {"actor.optim.nope": 1})
    with pytest.raises(ValueError, match=r"wrong type: actor\.clip_ratio_low='abc'"):
        root_config(settings, {"actor.clip_ratio_low": "abc"})
    with pytest.raises(ValueError, match="Invalid loss_agg_mode"):  # verl's own check
        validate(root_config(settings, {"actor.loss_agg_mode": "nonsense"}), load_tokenizer=False)


def test_without_flash_attention_the_cuda_profile_keeps_padding_and_sdpa() -> None:
    profile = cuda_profile(4096, lora=True, flash_attention=False)
    assert (profile.remove_padding, profile.attention, profile.dtype) == (False, "sdpa", "bf16")


# ------------------------------------------------------------------------------------------------ memory


@pytest.mark.slow
@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_memory_estimate_is_within_a_quarter_of_a_measured_peak(checkpointing: bool) -> None:
    # the same formula the plan uses for a GPU, in fp32 without the CUDA context, against this CPU's peak
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("bench_update_memory", BENCH / "bench_update_memory.py")
        assert spec is not None and spec.loader is not None
        bench = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench)
        row = bench.compare(2048, checkpointing)
    finally:
        sys.path.remove(str(BENCH))
    print(f"update memory at 2048 tokens (checkpointing {checkpointing}): {row}")
    assert 0.75 <= row["ratio"] <= 1.25, row
