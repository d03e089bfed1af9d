"""The scripted upstream answers like a vLLM server: its ids re-encode from the documented template, streams and
complete answers agree, and the script's rules (tool call, tool result, errors, truncation) hold."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from agl.testing.upstream import (
    ThreadedUpstream,
    encode,
    logprob_of,
    render_prompt,
    run_in_thread,
    start_upstream_process,
)

TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def upstream() -> Iterator[ThreadedUpstream]:
    up = run_in_thread()
    yield up
    up.stop()


def post(up: ThreadedUpstream, body: dict[str, Any] | bytes) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{up.url}/chat/completions", content=content, headers={"content-type": "application/json"})


def sse_chunks(resp: httpx.Response) -> list[dict[str, Any]]:
    events = [line[len("data: ") :] for line in resp.text.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_encode_splits_words_punctuation_and_spaces() -> None:
    assert len(encode("Hello, world!")) == 5  # Hello , ␠ world !
    assert encode("a a") == [encode("a")[0], encode(" ")[0], encode("a")[0]]
    assert encode("") == []
    assert all(10 <= i < 50_010 for i in encode("some text: 12+30 = 42"))


def test_render_prompt_follows_the_documented_template() -> None:
    messages = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}],
        },
        {"role": "tool", "tool_call_id": "c", "content": "2"},
    ]
    text = render_prompt(messages, TOOLS)
    # tools and tool calls in the Hermes format the trainer's chat format uses (agl.common.hermes)
    assert text.startswith("<|tools|>\n# Tools\n") and '\n{"type": "function", "function": {"name": ' in text
    assert (
        '<|user|>\nhi\n<|assistant|>\n<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>\n<|tool|>\n2\n'
        in text
    )
    assert text.endswith("<|assistant|>\n")
    assert (
        render_prompt([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
        == "<|user|>\na\nb\n<|assistant|>\n"
    )


def test_complete_answer_carries_exact_ids_and_logprobs_when_asked(upstream: ThreadedUpstream) -> None:
    messages = [{"role": "user", "content": "good morning"}]
    body = post(upstream, {"model": "m", "messages": messages, "return_token_ids": True, "logprobs": True}).json()
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "Echo: good morning"}
    assert body["prompt_token_ids"] == encode(render_prompt(messages))
    assert choice["token_ids"] == encode("Echo: good morning")
    assert [e["logprob"] for e in choice["logprobs"]["content"]] == [
        logprob_of(t, i) for i, t in enumerate(choice["token_ids"])
    ]
    assert body["usage"]["completion_tokens"] == len(choice["token_ids"])
    plain = post(upstream, {"model": "m", "messages": messages}).json()
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]
    assert plain["choices"][0]["logprobs"] is None


def test_arithmetic_with_tools_gives_a_tool_call_then_the_tool_result_answers(upstream: ThreadedUpstream) -> None:
    client = openai.OpenAI(base_url=upstream.url, api_key="k", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "What is 12 + 30?"}]
    first = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)  # type: ignore[arg-type]
    assert first.choices[0].finish_reason == "tool_calls"
    (call,) = first.choices[0].message.tool_calls or []
    assert call.function.name == "calculator" and json.loads(call.function.arguments) == {"expression": "12+30"}
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "42"},
    ]
    second = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)  # type: ignore[arg-type]
    assert second.choices[0].message.content == "The answer is 42"
    no_tools = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "What is 1+2?"}])
    assert no_tools.choices[0].message.content == "Echo: What is 1+2?"


def _tool(name: str, **properties: str) -> dict[str, Any]:
    props = {k: {"type": v} for k, v in properties.items()}
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": props}}}


def test_directives_script_each_agent_tools_in_order_then_its_own_text(upstream: ThreadedUpstream) -> None:
    """`agl-tools:` calls each listed, offered, not yet called tool in turn; `agl-say:` then answers."""
    client = openai.OpenAI(base_url=upstream.url, api_key="k", max_retries=0)
    tools = [
        _tool("search", query="string", limit="integer"),
        _tool("transfer_to_math"),
        _tool("calc", expression="string"),
    ]
    system = "You route.\nagl-tools: transfer_to_math, nonexistent, calc\nagl-say: Final: {tool}"
    messages: list[Any] = [{"role": "system", "content": system}, {"role": "user", "content": "Find 6 * 7 please"}]
    names, arguments = [], []
    for result in ("handed off", "42"):
        reply = client.chat.completions.create(model="m", messages=messages, tools=tools)  # type: ignore[arg-type]
        (call,) = reply.choices[0].message.tool_calls or []
        names.append(call.function.name)
        arguments.append(json.loads(call.function.arguments))
        messages += [
            reply.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": result},
        ]
    assert names == ["transfer_to_math", "calc"]
    assert arguments == [{}, {"expression": "6*7"}]
    final = client.chat.completions.create(model="m", messages=messages, tools=tools)  # type: ignore[arg-type]
    assert final.choices[0].message.content == "Final: 42"
    # string parameters other than `expression` get the user's message; a tool not offered is skipped
    only_search = [{"role": "system", "content": "agl-tools: search"}, {"role": "user", "content": "capital of France"}]
    reply = client.chat.completions.create(model="m", messages=only_search, tools=tools)  # type: ignore[arg-type]
    (call,) = reply.choices[0].message.tool_calls or []
    assert call.function.name == "search" and json.loads(call.function.arguments) == {"query": "capital of France"}
    say_only = [{"role": "system", "content": "agl-say: APPROVED"}, {"role": "user", "content": "check this"}]
    assert client.chat.completions.create(model="m", messages=say_only).choices[0].message.content == "APPROVED"  # type: ignore[arg-type]


def test_step_lines_script_one_answer_per_assistant_turn(upstream: ThreadedUpstream) -> None:
    bash = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}
    edit = {"type": "function", "function": {"name": "edit", "parameters": {"type": "object"}}}
    task = 'Fix it.\nagl-step: bash {"command": "cat a.py, b.py"}\nagl-step: edit {"old": "x", "new": "y"}\nagl-step: say "done\\nbye"'
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You code."}, {"role": "user", "content": task}]
    seen = []
    for _ in range(4):
        message = post(upstream, {"model": "m", "messages": messages, "tools": [bash, edit]}).json()["choices"][0][
            "message"
        ]
        seen.append(message)
        messages.append(message)
        for call in message.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "ok"})
    calls = [
        (m["tool_calls"][0]["function"]["name"], json.loads(m["tool_calls"][0]["function"]["arguments"]))
        for m in seen[:2]
    ]
    # commas and newlines in a step's JSON survive, unlike agl-args' comma-separated values
    assert calls == [("bash", {"command": "cat a.py, b.py"}), ("edit", {"old": "x", "new": "y"})]
    assert seen[2]["content"] == "done\nbye"
    assert seen[3]["content"].startswith("Echo: Fix it.")  # past the script, the other rules answer
    # a step whose tool is not offered (a harness's side call) falls through to the other rules
    side = post(upstream, {"model": "m", "messages": [{"role": "user", "content": task}]}).json()
    assert side["choices"][0]["message"]["content"].startswith("Echo: Fix it.")


def test_a_malformed_step_is_a_400_naming_it(upstream: ThreadedUpstream) -> None:
    resp = post(upstream, {"model": "m", "messages": [{"role": "user", "content": "agl-step: bash {not json}"}]})
    assert resp.status_code == 400 and "agl-step 1" in resp.text
    resp = post(upstream, {"model": "m", "messages": [{"role": "user", "content": 'agl-step: say {"a": 1}'}]})
    assert resp.status_code == 400 and "`say` takes a JSON string" in resp.text


@pytest.mark.parametrize("tools", [None, TOOLS])
def test_stream_carries_the_same_ids_and_message_as_the_complete_answer(upstream: ThreadedUpstream, tools: Any) -> None:
    request: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": "Sum 3*4 please"}],
        "return_token_ids": True,
        "logprobs": True,
    }
    if tools:
        request["tools"] = tools
    whole = post(upstream, request).json()
    chunks = sse_chunks(post(upstream, {**request, "stream": True, "stream_options": {"include_usage": True}}))
    assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    ids = [i for c in chunks for ch in c["choices"] for i in ch.get("token_ids", [])]
    assert ids == whole["choices"][0]["token_ids"]
    logprobs = [e["logprob"] for c in chunks for ch in c["choices"] for e in (ch["logprobs"] or {}).get("content", [])]
    assert logprobs == [e["logprob"] for e in whole["choices"][0]["logprobs"]["content"]]
    finishes = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]]
    assert finishes == [whole["choices"][0]["finish_reason"]]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]
    if tools:
        args = "".join(
            tc["function"].get("arguments", "")
            for c in chunks
            for ch in c["choices"]
            for tc in ch["delta"].get("tool_calls", [])
        )
        assert args == whole["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    else:
        text = "".join(ch["delta"].get("content") or "" for c in chunks for ch in c["choices"])
        assert text == whole["choices"][0]["message"]["content"]


def test_max_tokens_truncates_with_finish_reason_length(upstream: ThreadedUpstream) -> None:
    body = post(
        upstream,
        {"messages": [{"role": "user", "content": "one two three four"}], "max_tokens": 3, "return_token_ids": True},
    ).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["content"] == "Echo: "
    assert len(choice["token_ids"]) == 3


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"{oops", 400, "not valid JSON"),
        ({"messages": []}, 400, "messages"),
        ({"messages": ["hi"]}, 400, "object"),
        ({"messages": [{"role": "user", "content": "force_error:429 slow down"}]}, 429, "429"),
    ],
)
def test_errors_are_openai_shaped(upstream: ThreadedUpstream, body: Any, status: int, words: str) -> None:
    resp = post(upstream, body)
    assert resp.status_code == status
    assert words in resp.json()["error"]["message"]


def test_models_and_unknown_routes(upstream: ThreadedUpstream) -> None:
    assert httpx.get(f"{upstream.url}/models").json()["data"][0]["id"] == "scripted"
    assert httpx.get(f"{upstream.url}/nothing").status_code == 404


def test_process_mode_can_reject_token_id_parameter_like_a_hosted_api() -> None:
    proc, url = start_upstream_process(reject_unknown_params=True)
    try:
        resp = httpx.post(
            f"{url}/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "return_token_ids": True}
        )
        assert resp.status_code == 400 and "return_token_ids" in resp.json()["error"]["message"]
        ok = httpx.post(f"{url}/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
        assert ok.status_code == 200
    finally:
        proc.terminate()
        proc.wait(10)
