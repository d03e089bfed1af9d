"""Which of vLLM's tool-call parsers reads a model's tool calls (`--tool-call-parser`).

A model answers tool calls in the format its chat template taught it: Qwen 2.5 and 3 write Hermes-style
`<tool_call>{...}</tool_call>`, Llama 3.x a bare JSON object, Mistral `[TOOL_CALLS]`, and so on. vLLM parses
them only with the matching parser; with the wrong one every call comes back as plain text and no tool ever runs.
A model whose template does not render tools at all (SmolLM2) is served with agl's own Hermes template
(`chat_format.engine_chat_template`), so its parser is `hermes` whatever its family.
"""

from __future__ import annotations

from dataclasses import dataclass

from agl_trainer.model_shape import ModelShape

HERMES = "hermes"
LLAMA3_VOCAB = 128_256  # the Llama 3 tokenizer's: Llama 3.0-3.3 share it, SmolLM and Llama 2 do not


@dataclass(frozen=True)
class ParserChoice:
    parser: str
    why: str


# model_type → (parser, the family's name in messages)
FAMILY_PARSERS: dict[str, tuple[str, str]] = {
    "qwen2": (HERMES, "Qwen 2 / 2.5"),
    "qwen2_moe": (HERMES, "Qwen 2 MoE"),
    "qwen3": (HERMES, "Qwen 3"),
    "qwen3_moe": (HERMES, "Qwen 3 MoE"),
    "llama4": ("llama4_json", "Llama 4"),
    "mistral": ("mistral", "Mistral"),
    "mixtral": ("mistral", "Mixtral"),
    "granite": ("granite", "Granite"),
    "internlm2": ("internlm", "InternLM 2"),
    "phi3": ("phi4_mini_json", "Phi-3 / Phi-4-mini"),
    "deepseek_v3": ("deepseek_v3", "DeepSeek V3"),
}


def tool_parser(shape: ModelShape, *, template_renders_tools: bool | None = None) -> ParserChoice:
    """The parser for a model. `template_renders_tools`: whether its own chat template renders tools (read from
    its tokenizer files when present); False means agl serves it with its Hermes template."""
    if template_renders_tools is False:
        return ParserChoice(HERMES, "its chat template does not render tools: served with agl's Hermes template")
    if shape.model_type == "llama":
        if shape.vocab == LLAMA3_VOCAB:
            return ParserChoice("llama3_json", "Llama 3.x answers tool calls as a JSON object (llama3_json)")
        return ParserChoice(HERMES, "a Llama-architecture model without Llama 3's tool format: agl's Hermes template")
    found = FAMILY_PARSERS.get(shape.model_type)
    if found is not None:
        return ParserChoice(found[0], f"{found[1]} answers tool calls in the {found[0]} format")
    return ParserChoice(HERMES, f"no parser known for model_type {shape.model_type!r}: agl's Hermes template")
