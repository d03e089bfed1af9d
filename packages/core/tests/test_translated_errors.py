"""The translated APIs (Anthropic Messages, its count_tokens, OpenAI Responses) never answer 500: a request they
cannot translate is a 400 in the API's envelope; an answer the backend gave in an odd shape (`usage` of nulls, a
`created` that is no number, tool arguments nested 256 or 1,000 levels) is translated anyway; an answer that still
cannot be translated is a 502 in the API's envelope, and its call, already stored, is marked not trainable (the
agent never received it; with an SDK's retries it was stored trainable three times before)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from translated_upstream import Script, Served, attempt, nested, serve, stored

from agl.server import anthropic_messages, responses

SCRIPTS = {
    "usage-null": Script(text=["ok"], usage={"prompt_tokens": None, "completion_tokens": None}),
    "created-junk": Script(text=["ok"], created="yesterday"),
    "deep-1000": Script(calls=[("f", [nested(1000)])], finish="tool_calls"),
    "deep-256": Script(calls=[("f", [nested(256)])], finish="tool_calls"),
    "deep-950": Script(calls=[("f", [nested(950)])], finish="tool_calls"),
    "big-int": Script(calls=[("f", ['{"n": 123456789012345678901234567890}'])], finish="tool_calls"),
    "fine": Script(text=["fine"]),
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from serve(tmp_path_factory.mktemp("translated"), SCRIPTS)


def post(base: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{base}/v1/{path}", json=body, timeout=60)


def ask_messages(base: str, scenario: str, stream: bool = False) -> httpx.Response:
    body = {"model": "m", "max_tokens": 64, "stream": stream, "messages": [{"role": "user", "content": scenario}]}
    return post(base, "messages", body)


def ask_responses(base: str, scenario: str, stream: bool = False) -> httpx.Response:
    return post(base, "responses", {"model": "m", "stream": stream, "input": scenario})


def last_data(resp: httpx.Response) -> dict[str, Any]:
    """The data of a stream's last event."""
    last = [line for line in resp.text.split("\n") if line.startswith("data: ")][-1]
    data: dict[str, Any] = json.loads(last[len("data: ") :])
    return data


def events(resp: httpx.Response) -> list[str]:
    return [line[len("event: ") :] for line in resp.text.split("\n") if line.startswith("event: ")]


@pytest.mark.parametrize("tools", [5, True, "x", {"name": "f"}])
def test_a_request_of_another_shape_is_a_400_in_anthropics_envelope(served: Served, tools: Any) -> None:
    _, base = attempt(served.url)
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "fine"}], "tools": tools}
    for path in ("messages", "messages/count_tokens"):
        resp = post(base, path, body)
        assert resp.status_code == 400, (path, resp.text[:300])
        assert resp.json()["type"] == "error" and resp.json()["error"]["type"] == "invalid_request_error"
        assert "tools" in resp.json()["error"]["message"]
    resp = post(base, "responses", {"model": "m", "input": "fine", "tools": tools})
    assert resp.status_code == 400 and resp.json()["error"]["type"] == "invalid_request_error"


def test_a_request_no_check_foresaw_is_a_400_not_a_500(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(body: dict[str, Any]) -> dict[str, Any]:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(anthropic_messages, "to_chat", broken)
    monkeypatch.setattr(responses, "to_chat", broken)
    rid, base = attempt(served.url)
    for resp in (ask_messages(base, "fine"), ask_responses(base, "fine")):
        assert resp.status_code == 400 and "RecursionError" in resp.text, resp.text[:300]
    counted = post(base, "messages/count_tokens", {"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert counted.status_code == 400 and counted.json()["type"] == "error"
    assert stored(served.url, rid, 0) == []


@pytest.mark.parametrize("scenario", ["usage-null"])
def test_an_answer_without_usable_usage_counts_zero(served: Served, scenario: str) -> None:
    rid, base = attempt(served.url)
    llm = anthropic.Anthropic(base_url=base, api_key="k", max_retries=0)
    message = llm.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": scenario}])
    assert message.content[0].text == "ok" and message.usage.output_tokens == 0  # type: ignore[union-attr]
    answer = openai.OpenAI(base_url=f"{base}/v1", api_key="k", max_retries=0).responses.create(
        model="m", input=scenario
    )
    assert answer.output_text == "ok" and answer.usage is not None and answer.usage.total_tokens == 0
    assert [c.trainable for c in stored(served.url, rid, 2)] == [True, True]


def test_a_created_that_is_no_number_is_now(served: Served) -> None:
    rid, base = attempt(served.url)
    resp = ask_responses(base, "created-junk")
    assert resp.status_code == 200 and resp.json()["created_at"] > 1.7e9
    assert stored(served.url, rid)[0].trainable


@pytest.mark.parametrize("scenario", ["deep-256", "deep-1000", "deep-950"])
@pytest.mark.parametrize("stream", [False, True])
def test_deeply_nested_tool_arguments_are_answered_not_a_500(served: Served, scenario: str, stream: bool) -> None:
    rid, base = attempt(served.url)
    resp = ask_messages(base, scenario, stream)
    assert resp.status_code == 200, resp.text[:300]
    if stream:  # streamed as the model wrote them: the SDK's parser (jiter) stops near 200 levels
        assert events(resp)[-1] == "message_stop"
    else:
        assert resp.json()["content"][0]["input"] == {} and resp.json()["stop_reason"] == "tool_use"
    # the Responses API passes the arguments on as the model wrote them
    answer = ask_responses(base, scenario, stream)
    assert answer.status_code == 200
    final = last_data(answer)["response"] if stream else answer.json()
    assert final["output"][0]["arguments"] == nested(int(scenario.split("-")[1]))
    calls = stored(served.url, rid, 2)
    # a client cannot rebuild the streamed input: the agent did not receive this answer
    assert [c.trainable for c in calls] == [not stream, True]
    if stream:
        assert "no client can rebuild" in (calls[0].not_trainable_reason or "")


def test_an_integer_past_64_bits_in_tool_arguments_is_kept(served: Served) -> None:
    _, base = attempt(served.url)
    resp = ask_messages(base, "big-int")
    assert resp.status_code == 200 and resp.json()["content"][0]["input"] == {"n": 123456789012345678901234567890}


@pytest.mark.parametrize("api", ["messages", "responses"])
def test_an_answer_that_cannot_be_translated_is_a_502_and_its_call_not_trainable(
    served: Served, api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(answer: dict[str, Any], request: dict[str, Any], answer_id: str | None = None) -> dict[str, Any]:
        raise RecursionError("maximum recursion depth exceeded while decoding a JSON array")

    monkeypatch.setattr(anthropic_messages if api == "messages" else responses, "from_chat", broken)
    rid, base = attempt(served.url)
    resp = (ask_messages if api == "messages" else ask_responses)(base, "fine")
    assert resp.status_code == 502, resp.text[:300]
    if api == "messages":
        assert resp.json()["type"] == "error" and resp.json()["error"]["type"] == "api_error"
    else:
        assert resp.json()["error"]["type"] == "upstream_error"
    assert "RecursionError" in resp.text
    (call,) = stored(served.url, rid)
    assert not call.trainable and "RecursionError" in (call.not_trainable_reason or "")
    assert call.http_status == 502  # what the agent got, not the answer the engine gave
    assert str(call.seq) == resp.headers["x-agl-llm-seq"]


def test_with_an_sdks_retries_no_untranslatable_answer_is_stored_trainable(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(answer: dict[str, Any], request: dict[str, Any], answer_id: str | None = None) -> dict[str, Any]:
        raise ValueError("no")

    monkeypatch.setattr(anthropic_messages, "from_chat", broken)
    rid, base = attempt(served.url)
    llm = anthropic.Anthropic(base_url=base, api_key="k", max_retries=2)
    llm = llm.with_options(timeout=30)
    with pytest.raises(anthropic.APIStatusError):
        llm.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "fine"}])
    calls = stored(served.url, rid, 3)
    assert len(calls) == 3 and not any(c.trainable for c in calls)


# where the translation fails: at the first chunk (before the relay stored the call) or at the end (after)
@pytest.mark.parametrize("step", ["chunk", "done"])
@pytest.mark.parametrize("api", ["messages", "responses"])
def test_a_stream_that_cannot_be_translated_ends_with_an_error_event_and_its_call_not_trainable(
    served: Served, api: str, step: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any) -> list[bytes]:
        raise RecursionError("too deep")

    stream = anthropic_messages.MessagesStream if api == "messages" else responses.ResponsesStream
    monkeypatch.setattr(stream, step, broken)
    rid, base = attempt(served.url)
    resp = (ask_messages if api == "messages" else ask_responses)(base, "fine", stream=True)
    assert resp.status_code == 200 and events(resp)[-1] == "error" and "RecursionError" in resp.text
    (call,) = stored(served.url, rid)
    assert not call.trainable and "RecursionError" in (call.not_trainable_reason or "")
