"""The chat template agl gives vLLM (`engine_chat_template`) renders every conversation exactly as agl's own
`render_prompt` does, given the request in the shape vLLM hands a template (rendered here with transformers'
renderer, as vLLM does; tests/test_vllm_engine.py checks the same against a real vLLM server)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from chat_cases import BARE, CONVERSATIONS, as_vllm_passes_it

from agl_trainer.chat_format import (
    FUNCTION_FIELDS,
    canonical_tool,
    engine_chat_template,
    render_prompt,
    render_tool_call,
    tool_arguments,
)


@pytest.fixture(scope="module")
def tokenizer(tiny: Any) -> Any:
    return tiny[1]


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_the_engine_template_renders_what_render_prompt_renders(tokenizer: Any, name: str) -> None:
    messages, tools = CONVERSATIONS[name]
    template = engine_chat_template(tokenizer)
    expected = render_prompt(tokenizer, messages, tools)
    seen_messages, seen_tools = as_vllm_passes_it(messages, tools)
    rendered = tokenizer.apply_chat_template(
        seen_messages, tools=seen_tools, chat_template=template, add_generation_prompt=True, tokenize=False
    )
    assert rendered == expected
    calls = sum(len(m.get("tool_calls") or []) for m in messages)
    assert rendered.count("<tool_call>{") == calls + (1 if tools else 0)  # the tools block shows the format once
    if tools:
        assert "# Tools" in rendered and rendered.count('{"type": "function"') == len(tools)


def test_what_agl_renders_for_tools_and_arguments() -> None:
    assert tool_arguments('{"b": 1, "a": 2}') == {"b": 1, "a": 2}  # key order kept
    assert tool_arguments("oops") == {} and tool_arguments("[1]") == {} and tool_arguments(None) == {}
    assert tool_arguments({"x": 1}) == {"x": 1}
    assert canonical_tool(BARE) == {"type": "function", "function": {"name": "now"}}
    assert list(
        canonical_tool({"function": {"parameters": {}, "strict": False, "name": "f", "extra": 1}})["function"]
    ) == [
        "name",
        "parameters",
        "strict",
    ]
    assert FUNCTION_FIELDS == ("name", "description", "parameters", "strict")
    rendered = render_tool_call("search", '{"q": "Zürich"}')
    assert rendered == "<tool_call>" + json.dumps({"name": "search", "arguments": {"q": "Zürich"}}) + "</tool_call>"
    assert "\\u00fc" in rendered  # ASCII-escaped, as json.dumps writes it (the template asks tojson for the same)


def test_a_tool_call_turn_is_never_rendered_empty(tokenizer: Any) -> None:
    """The scoping slip this guards against: text collected inside the tool-call loop and lost at its end."""
    messages, tools = CONVERSATIONS["tool calls and results"]
    seen_messages, seen_tools = as_vllm_passes_it(messages, tools)
    rendered = tokenizer.apply_chat_template(
        seen_messages,
        tools=seen_tools,
        chat_template=engine_chat_template(tokenizer),
        add_generation_prompt=True,
        tokenize=False,
    )
    assert (
        '<|im_start|>assistant\n<tool_call>{"name": "calculator", "arguments": {"expression": "12 * 34"}}' in rendered
    )


def test_arguments_as_a_json_string_are_refused_not_guessed(tokenizer: Any) -> None:
    messages, tools = CONVERSATIONS["tool calls and results"]
    with pytest.raises(Exception, match="must arrive parsed"):
        tokenizer.apply_chat_template(
            messages,
            tools=tools,
            chat_template=engine_chat_template(tokenizer),
            add_generation_prompt=True,
            tokenize=False,
        )


def test_vllm_keeps_developer_messages(tokenizer: Any) -> None:
    # vLLM turns 'developer' messages into system ones (and merges all system messages) unless the template
    # mentions the role by name, quoted; agl's rendering keeps them as they are
    assert "'developer'" in engine_chat_template(tokenizer)


def test_a_template_with_native_tools_is_served_as_it_is() -> None:
    class NativeTools:
        chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}{% if tools %}{{ tools }}{% endif %}"

    assert engine_chat_template(NativeTools()) is None

    class NoTemplate:
        chat_template = None

    with pytest.raises(ValueError, match="no chat template"):
        engine_chat_template(NoTemplate())
