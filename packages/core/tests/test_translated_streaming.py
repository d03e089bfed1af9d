"""A streamed Messages or Responses call streams: the backend is asked for a chat stream and each chunk is sent on
as the API's events when it comes (before, the whole answer was awaited and the events sent after it). Checked
with the real `anthropic` and `openai` SDKs against a real agl server: the first event arrives while the backend
is still answering, the SDK's final message equals the non-streamed translation, tool arguments stream as
`input_json_delta` / `function_call_arguments.delta`, the call is stored as a chat stream is, and a backend's error
mid-stream is the API's error event."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from translated_upstream import Script, Served, attempt, serve, stored

from agl.server import anthropic_messages, responses

ARGS = ['{"expression"', ': "12', '*7"}']
SCRIPTS = {
    "slow": Script(text=["one", " two", " three", " four", " five"], gap_s=0.3),
    "text": Script(text=["Hello", ",", " world"]),
    "tool": Script(calls=[("calculator", ARGS)], finish="tool_calls"),
    "both": Script(text=["Let me", " compute"], calls=[("calculator", ARGS), ("echo", ['{"x":', " 1}"])]),
    "list-args": Script(calls=[("calculator", ["[1,", " 2]"])], finish="tool_calls"),
    "cut": Script(text=["a", " b"], finish="length"),
    "fails": Script(text=["a", " b", " c"], error_after=2),
}
TOOLS: list[Any] = [
    {"name": "calculator", "input_schema": {"type": "object"}},
    {"name": "echo", "input_schema": {"type": "object"}},
]
FUNCTIONS: list[Any] = [{"type": "function", "name": t["name"], "parameters": t["input_schema"]} for t in TOOLS]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from serve(tmp_path_factory.mktemp("streaming"), SCRIPTS)


def clients(served: Served) -> tuple[str, anthropic.Anthropic, openai.OpenAI]:
    rid, base = attempt(served.url)
    return (
        rid,
        anthropic.Anthropic(base_url=base, api_key="k", max_retries=0),
        openai.OpenAI(base_url=f"{base}/v1", api_key="k", max_retries=0),
    )


def ask(scenario: str) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": scenario}], "tools": TOOLS}


def without_ids(value: Any) -> Any:
    """`value` without the ids the proxy makes up for each answer (a message's, a response's, its items') and what
    the openai SDK adds to a streamed response (`parsed`, `parsed_arguments`)."""
    if isinstance(value, dict):
        return {k: without_ids(v) for k, v in value.items() if k not in ("id", "parsed", "parsed_arguments")}
    if isinstance(value, list):
        return [without_ids(v) for v in value]
    return value


def test_the_first_events_arrive_while_the_backend_is_still_answering(served: Served) -> None:
    _, llm, oai = clients(served)
    with llm.messages.stream(**ask("slow")) as stream:
        text = next(iter(stream.text_stream))
        first = time.monotonic()
        assert "".join(stream.text_stream) == " two three four five"
    # the backend pauses 0.3 s before each of its 8 chunks: the first word came about 2 s before its last chunk
    assert served.upstream.last_sent - first > 1.0, served.upstream.last_sent - first
    assert text == "one"
    events = oai.responses.create(model="m", input="slow", stream=True)
    for event in events:
        if event.type == "response.output_text.delta":
            first = time.monotonic()
            break
    assert [e.type for e in events][-1] == "response.completed"
    assert served.upstream.last_sent - first > 1.0, served.upstream.last_sent - first


@pytest.mark.parametrize("scenario", ["text", "tool", "both", "list-args", "cut"])
def test_a_streamed_message_is_the_message_not_streamed(served: Served, scenario: str) -> None:
    rid, llm, _ = clients(served)
    whole = llm.messages.create(**ask(scenario))
    with llm.messages.stream(**ask(scenario)) as stream:
        events = list(stream)
        streamed = stream.get_final_message()
    assert without_ids(streamed.model_dump()) == without_ids(whole.model_dump())
    assert [b.id for b in streamed.content if b.type == "tool_use"] == [
        b.id for b in whole.content if b.type == "tool_use"
    ]
    partials = [
        e.delta.partial_json for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]
    if scenario in ("tool", "both"):
        assert partials[:3] == ARGS  # as the backend sent them, one delta per chunk
    if scenario == "list-args":  # not an object: sent whole, as the input it is read as
        assert partials == ['{"value": [1, 2]}'] and streamed.content[0].input == {"value": [1, 2]}  # type: ignore[union-attr]
    texts = [e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta"]
    assert texts == SCRIPTS[scenario].text
    plain, chunked = stored(served.url, rid, 2)
    assert (plain.stream, chunked.stream) == (False, True) and plain.trainable and chunked.trainable
    assert chunked.route == "messages" and chunked.request.get("stream") is True
    assert chunked.response_ids == plain.response_ids == list(range(10, 10 + SCRIPTS[scenario].pieces()))
    assert chunked.logprobs == plain.logprobs


@pytest.mark.parametrize("scenario", ["text", "tool", "both", "cut"])
def test_a_streamed_response_is_the_response_not_streamed(served: Served, scenario: str) -> None:
    rid, _, oai = clients(served)
    whole = oai.responses.create(model="m", input=scenario, tools=FUNCTIONS)
    with oai.responses.stream(model="m", input=scenario, tools=FUNCTIONS) as stream:
        events = list(stream)
    # a cut answer ends with response.incomplete, which the SDK's get_final_response does not take
    streamed = next(e.response for e in events if e.type in ("response.completed", "response.incomplete"))
    assert without_ids(streamed.model_dump()) == without_ids(whole.model_dump())
    assert streamed.id == next(e.response.id for e in events if e.type == "response.created")
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    if scenario in ("tool", "both"):
        assert deltas[:3] == ARGS
    texts = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert texts == SCRIPTS[scenario].text
    plain, chunked = stored(served.url, rid, 2)
    assert chunked.stream and chunked.trainable and chunked.route == "responses"
    assert chunked.response_ids == plain.response_ids


def test_a_backends_error_mid_stream_is_the_apis_error_event(served: Served) -> None:
    rid, llm, oai = clients(served)
    with pytest.raises(anthropic.APIStatusError, match="failed mid-answer"), llm.messages.stream(**ask("fails")) as s:
        list(s)
    with pytest.raises(openai.APIError, match="failed mid-answer"):
        list(oai.responses.create(model="m", input="fails", stream=True))
    calls = stored(served.url, rid, 2)
    assert len(calls) == 2 and not any(c.trainable for c in calls)


def test_an_agent_that_hangs_up_mid_stream_leaves_its_call_not_trainable(served: Served) -> None:
    """The proxy's streamed response is kept (only its bytes are translated), so it still notes the hang-up."""
    rid, base = attempt(served.url)
    body = {**ask("slow"), "stream": True}
    with httpx.stream("POST", f"{base}/v1/messages", json=body, timeout=30) as resp:
        for line in resp.iter_lines():
            if "text_delta" in line:
                break  # the first word came: the agent leaves
    (call,) = stored(served.url, rid)
    deadline = time.monotonic() + 10
    while call.trainable and time.monotonic() < deadline:
        time.sleep(0.1)
        (call,) = stored(served.url, rid)
    assert not call.trainable and call.http_status == 499


def chat_chunks(text: list[str], args: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A chat stream's chunks (text, then one tool call) and the answer they make whole."""
    base: dict[str, Any] = {"model": "m", "created": 1}
    chunks = [{**base, "prompt_token_ids": [1, 2], "choices": [{"index": 0, "delta": {"role": "assistant"}}]}]
    chunks += [{**base, "choices": [{"index": 0, "delta": {"content": t}}]} for t in text]
    opened = {"index": 0, "id": "call_0", "type": "function", "function": {"name": "f", "arguments": ""}}
    chunks.append({**base, "choices": [{"index": 0, "delta": {"tool_calls": [opened]}}]})
    for a in args:
        chunks.append(
            {**base, "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": a}}]}}]}
        )
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    usage = {"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7}
    chunks.append({**base, "choices": [], "usage": usage})
    call = {**opened, "function": {"name": "f", "arguments": "".join(args)}}
    message = {"role": "assistant", "content": "".join(text), "tool_calls": [call]}
    answer = {**base, "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}], "usage": usage}
    return chunks, answer


def kinds(events: list[bytes]) -> list[str]:
    """The events' types, a run of deltas as one (the incremental stream sends a delta per chunk)."""
    out: list[str] = []
    for event in b"".join(events).split(b"\n\n"):
        if event.startswith(b"event: "):
            kind = event.split(b"\n")[0][len(b"event: ") :].decode()
            if not (out and out[-1] == kind and kind.endswith("delta")):
                out.append(kind)
    return out


@pytest.mark.parametrize("api", ["messages", "responses"])
def test_the_incremental_stream_sends_the_event_sequence_of_the_whole_answer(api: str) -> None:
    chunks, answer = chat_chunks(["Hi", " there"], ['{"x"', ": 1}"])
    module: Any = anthropic_messages if api == "messages" else responses
    request = {"model": "m", "max_tokens": 8}
    stream = module.MessagesStream(request) if api == "messages" else module.ResponsesStream(request)
    incremental = [e for c in chunks for e in stream.chunk(c)] + stream.done()
    assert kinds(incremental) == kinds(list(module.stream_events(module.from_chat(answer, request))))
