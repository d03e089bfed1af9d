"""A fresh LoRA adapter as a peft folder, written without loading the model's weights.

Why: with a LoRA policy on CUDA the frozen base model is loaded in bf16 (half the memory of fp32, which verl's
default `model_dtype` would load), while the adapter, the only weights the optimizer updates, stays fp32. verl
0.9.1 builds a new adapter with `get_peft_model` and then casts it to the base model's dtype ("FSDP requires all
params in a flat group to share dtype", `FSDPEngine._build_lora_module`), which would make the adapter bf16 too.
An adapter verl loads from a folder (`model.lora_adapter_path`) is not cast: peft's `PeftModel.from_pretrained`
keeps it fp32 (`autocast_adapter_dtype`), and FSDP2 asks only the trainable parameters to share a dtype
(`torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py`). So agl writes the fresh adapter itself, initialised
as peft initialises one (A: Kaiming-uniform with a = √5, B: zeros, so the policy starts as the base model), and
hands verl its folder.

The model is built on the meta device from its config.json alone: the adapter's names and shapes are peft's own.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def fresh_adapter_folder(
    model_path: str | Path, *, rank: int, alpha: int, targets: list[str], seed: int
) -> Iterator[Path]:
    """`write_fresh_adapter` into a folder of its own, deleted on leaving: verl reads it only while it builds the
    model (`FSDPEngine._build_lora_module`), and each rank of each run wrote one that stayed in the temp folder."""
    with tempfile.TemporaryDirectory(prefix="agl-fresh-adapter-") as folder:
        yield write_fresh_adapter(model_path, folder, rank=rank, alpha=alpha, targets=targets, seed=seed)


def write_fresh_adapter(
    model_path: str | Path,
    folder: str | Path,
    *,
    rank: int,
    alpha: int,
    targets: list[str],
    seed: int,
) -> Path:
    """A new LoRA adapter for the model in `model_path`, as peft's `save_pretrained` would write it, in `folder`.
    The same `seed` gives the same adapter on every rank."""
    import torch
    from peft import LoraConfig, TaskType, get_peft_model
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    lora = LoraConfig(task_type=TaskType.CAUSAL_LM, r=rank, lora_alpha=alpha, target_modules=list(targets), bias="none")
    peft_model: Any = get_peft_model(skeleton, lora)
    generator = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for name, param in peft_model.named_parameters():
        if "lora_" not in name:
            continue
        tensor = torch.zeros(param.shape, dtype=torch.float32)
        if ".lora_A." in name:  # peft's default: kaiming_uniform_(a=sqrt(5)) → U(-1/√fan_in, 1/√fan_in)
            bound = 1.0 / math.sqrt(param.shape[1])
            tensor.uniform_(-bound, bound, generator=generator)
        state[name.replace(".default.", ".")] = tensor  # peft's saved names carry no adapter name
    if not state:
        raise ValueError(f"no module of {model_path} matches the LoRA targets {targets}")
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    saved = peft_model.peft_config["default"].to_dict()
    saved = {k: (sorted(v) if isinstance(v, set) else v) for k, v in saved.items()}
    saved.update(base_model_name_or_path=str(model_path), inference_mode=False)
    (out / "adapter_config.json").write_text(json.dumps(saved, indent=2, sort_keys=True, default=str))
    save_file(state, str(out / "adapter_model.safetensors"))
    return out
