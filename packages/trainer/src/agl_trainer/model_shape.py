"""A model's shape read from its folder's `config.json` alone: no weights, no torch, no network.

What the plan needs from a model: its family (for vLLM's tool-call parser), its parameter count (weights,
gradients and optimizer states scale with it), the sizes that activations and logits scale with, and the longest
context it was trained for (vLLM's `--max-model-len` defaults to it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelShape:
    model_type: str  # config.json's model_type: llama, qwen2, mistral, ...
    architectures: tuple[str, ...]
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool
    max_positions: int
    qkv_bias: bool

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer: attention, gated MLP, two norms."""
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_dim
        o = self.heads * self.head_dim * self.hidden
        bias = (self.heads * self.head_dim + 2 * self.kv_dim) if self.qkv_bias else 0
        mlp = 3 * self.hidden * self.intermediate
        return q + kv + o + bias + mlp + 2 * self.hidden

    @property
    def layer_values_per_token(self) -> int:
        """Values one decoder layer keeps per token for its own operations' backward (RMSNorm, rotary, attention
        output, the MLP's gate and the two factors of its product; flash/sdpa attention keeps no seq² matrix)."""
        return 3 * self.hidden + 2 * self.heads * self.head_dim + 3 * self.intermediate

    @property
    def params(self) -> int:
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return embeddings + self.layers * self.layer_params + self.hidden

    def lora_params(self, rank: int, targets: tuple[str, ...]) -> int:
        """Parameters of a LoRA adapter of `rank` on `targets` (projection names) in every layer."""
        shapes = {
            "q_proj": (self.hidden, self.heads * self.head_dim),
            "k_proj": (self.hidden, self.kv_dim),
            "v_proj": (self.hidden, self.kv_dim),
            "o_proj": (self.heads * self.head_dim, self.hidden),
            "gate_proj": (self.hidden, self.intermediate),
            "up_proj": (self.hidden, self.intermediate),
            "down_proj": (self.intermediate, self.hidden),
        }
        per_layer = sum(rank * (fan_in + fan_out) for name, (fan_in, fan_out) in shapes.items() if name in targets)
        return per_layer * self.layers


def _first(config: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    return None


def read_shape(model_dir: str | Path) -> ModelShape:
    """The shape of the model in `model_dir` (a Hugging Face folder; only its config.json is read)."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: --plan reads the model folder's config.json")
    return shape_from_config(json.loads(path.read_text()), where=str(path))


def shape_from_config(raw: dict[str, Any], where: str = "the model's config") -> ModelShape:
    """The shape a model's config (config.json's content, or a loaded model's `config.to_dict()`) describes."""
    config = raw.get("text_config") or raw  # multimodal wrappers keep the language model's sizes there
    missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size") if k not in config]
    if missing:
        raise ValueError(f"{where} has no {', '.join(missing)}: not a decoder-only language model agl can plan for")
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    model_type = str(raw.get("model_type") or config.get("model_type") or "unknown")
    return ModelShape(
        model_type=model_type,
        architectures=tuple(raw.get("architectures") or ()),
        hidden=hidden,
        intermediate=int(_first(config, "intermediate_size", "ffn_dim") or 4 * hidden),
        layers=int(config["num_hidden_layers"]),
        heads=heads,
        kv_heads=int(_first(config, "num_key_value_heads") or heads),
        head_dim=int(_first(config, "head_dim") or hidden // heads),
        vocab=int(config["vocab_size"]),
        tied_embeddings=bool(raw.get("tie_word_embeddings", config.get("tie_word_embeddings", False))),
        max_positions=int(_first(config, "max_position_embeddings", "max_sequence_length", "n_positions") or 2048),
        # Qwen2 has biases on q/k/v; Llama, Mistral and SmolLM do not
        qkv_bias=bool(config.get("attention_bias", model_type in ("qwen2", "qwen2_moe"))),
    )
