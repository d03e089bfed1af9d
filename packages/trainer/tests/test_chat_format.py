"""Messages and tools → prompt text; generated text → content and tool calls (malformed ones stay text)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agl_trainer.chat_format import parse_answer, render_prompt, to_template_messages

TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]


def test_tools_join_the_system_message_and_tool_calls_are_written_out() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "2+3?"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": '{"expression": "2+3"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
    ]
    out = to_template_messages(messages, TOOLS)
    assert out[0]["role"] == "system" and out[0]["content"].startswith("Be brief.\n\n# Tools")
    assert json.dumps(TOOLS[0]) in out[0]["content"]
    assert out[1] == {"role": "user", "content": "What is \n2+3?"}  # text parts joined with newlines, as vLLM does
    assert out[2]["content"] == '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'
    assert out[3] == {"role": "tool", "content": "5"}
    no_system = to_template_messages([{"role": "user", "content": "hi"}], TOOLS)
    assert no_system[0]["role"] == "system" and no_system[0]["content"].startswith("# Tools")


def test_render_prompt_uses_the_models_template(tiny: Any) -> None:
    _, tokenizer = tiny
    text = render_prompt(tokenizer, [{"role": "user", "content": "hi"}])
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="at least one message"):
        render_prompt(tokenizer, [])


def test_well_formed_tool_calls_are_parsed() -> None:
    text = 'Let me compute.<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'
    parsed = parse_answer(text, TOOLS)
    assert parsed.content == "Let me compute."
    (call,) = parsed.tool_calls
    assert call["function"] == {"name": "calculator", "arguments": '{"expression": "2+3"}'}
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert parse_answer(text, TOOLS).message()["tool_calls"]


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}</tool_call>',  # bad JSON
        '<tool_call>{"name": "search", "arguments": {}}</tool_call>',  # a tool that was not offered
        '<tool_call>{"name": "calculator", "arguments": "2+3"}</tool_call>',  # arguments not an object
        '<tool_call>["calculator"]</tool_call>',
        '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}',  # never closed
    ],
)
def test_malformed_tool_calls_come_back_as_text(text: str) -> None:
    parsed = parse_answer(text, TOOLS)
    assert parsed.content == text and parsed.tool_calls == [] and parsed.malformed_tool_call


def test_without_tools_nothing_is_parsed() -> None:
    text = '<tool_call>{"name": "calculator", "arguments": {}}</tool_call>'
    assert parse_answer(text, None).content == text
    assert parse_answer("plain answer", TOOLS).message() == {"role": "assistant", "content": "plain answer"}
