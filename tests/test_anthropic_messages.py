"""Anthropic's Messages API on agl's proxy (issue #44): a real `agl serve` with the scripted upstream, called with
the real `anthropic` SDK — not streamed and streamed, with a tool, its `tool_use` and the `tool_result` — recorded
with exact token ids like a chat completion, under the route `messages`; refusals in Anthropic's error envelope; an
app's import-time client reaching agl through `agl worker` with a server token (the attempt's credential)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from agl.client import Client
from agl.common import hermes
from agl.common.processes import ServerProcess, start_server, start_worker
from agl.schema import LLMCall
from agl.testing.fixtures import wait_rollouts
from agl.testing.upstream import encode, render_prompt

CALC = {
    "name": "calculator",
    "description": "Evaluate an arithmetic expression.",
    "input_schema": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
}
SYSTEM = "You are solver.\nagl-tools: calculator"
QUESTION = {"role": "user", "content": "What is 12 * 7?"}


@pytest.fixture
def server(tmp_path: Path, upstream: str) -> Iterator[ServerProcess]:
    proc = start_server(tmp_path / "run", upstream=upstream)
    yield proc
    proc.stop()


def attempt(server: ServerProcess, client: Client) -> tuple[str, anthropic.Anthropic, str]:
    (rollout,) = client.enqueue("x")
    (claim,) = httpx.post(f"{server.url}/api/v1/claims", json={"worker_id": "w"}).json()
    base = f"{server.url}/rollout/{rollout.id}/attempt/{claim['attempt']['id']}"
    return rollout.id, anthropic.Anthropic(base_url=base, api_key="k", max_retries=0), claim["attempt"]["id"]


def stored(client: Client, rollout_id: str) -> list[LLMCall]:
    return sorted(client.rollout_detail(rollout_id).llm_calls, key=lambda c: c.seq)


def assert_exact(call: LLMCall, response_text: str) -> None:
    assert call.trainable and call.status == "ok" and call.route == "messages"
    assert call.prompt_ids == encode(render_prompt(call.request["messages"], call.request.get("tools")))
    assert call.response_ids == encode(response_text)
    assert call.logprobs is not None and len(call.logprobs) == len(call.response_ids)


def test_a_tool_use_and_its_result_round_trip_and_are_recorded_exactly(server: ServerProcess) -> None:
    with Client(server.url) as client:
        rollout_id, llm, _ = attempt(server, client)
        first = llm.messages.create(
            model="claude-app-model", max_tokens=64, system=SYSTEM, messages=[QUESTION], tools=[CALC]
        )
        assert first.stop_reason == "tool_use" and first.role == "assistant" and first.type == "message"
        (use,) = [b for b in first.content if b.type == "tool_use"]
        assert use.name == "calculator" and use.input == {"expression": "12*7"}
        result = {"type": "tool_result", "tool_use_id": use.id, "content": "84"}
        second = llm.messages.create(
            model="claude-app-model",
            max_tokens=64,
            system=SYSTEM,
            messages=[QUESTION, {"role": "assistant", "content": first.content}, {"role": "user", "content": [result]}],
            tools=[CALC],
        )
        assert second.stop_reason == "end_turn" and [b.type for b in second.content] == ["text"]
        assert second.content[0].text == "The answer is 84"  # type: ignore[union-attr]
        assert second.usage.output_tokens == len(encode("The answer is 84")) and second.usage.input_tokens > 0
        calls = stored(client, rollout_id)
    assert len(calls) == 2
    tool_call, answer = calls
    # the system prompt, the question, the tool's call and its result: as a chat model is shown them
    assert [m["role"] for m in answer.request["messages"]] == ["system", "user", "assistant", "tool"]
    assert answer.request["messages"][2]["tool_calls"][0]["id"] == use.id
    assert answer.request["messages"][3] == {"role": "tool", "tool_call_id": use.id, "content": "84"}
    assert_exact(answer, "The answer is 84")
    assert tool_call.trainable and tool_call.route == "messages"
    rendered = hermes.render_tool_call(
        "calculator", tool_call.response_message["tool_calls"][0]["function"]["arguments"]
    )  # type: ignore[index]
    assert tool_call.response_ids == encode(rendered)


def test_streamed_messages_arrive_as_anthropics_events(server: ServerProcess) -> None:
    with Client(server.url) as client:
        rollout_id, llm, _ = attempt(server, client)
        with llm.messages.stream(
            model="claude-app-model", max_tokens=64, messages=[{"role": "user", "content": "hello there"}]
        ) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert text == "Echo: hello there" and final.stop_reason == "end_turn"
        with llm.messages.stream(
            model="claude-app-model", max_tokens=64, system=SYSTEM, messages=[QUESTION], tools=[CALC]
        ) as stream:
            used = stream.get_final_message()
        assert used.stop_reason == "tool_use"
        (use,) = [b for b in used.content if b.type == "tool_use"]
        assert use.input == {"expression": "12*7"}  # rebuilt by the SDK from the input_json_delta
        calls = stored(client, rollout_id)
    assert [(c.stream, c.route) for c in calls] == [(True, "messages"), (True, "messages")]
    assert_exact(calls[0], "Echo: hello there")


def test_a_system_message_between_turns_keeps_its_place(server: ServerProcess) -> None:
    """Claude Code sends its environment as a `system` message after the first user turn."""
    with Client(server.url) as client:
        rollout_id, llm, _ = attempt(server, client)
        between = {"role": "system", "content": [{"type": "text", "text": "Working directory: /w"}]}
        answer = llm.messages.create(
            model="m",
            max_tokens=32,
            system="You echo.",
            messages=[QUESTION, between],  # type: ignore[list-item]
        )
        assert answer.content[0].text == f"Echo: {QUESTION['content']}"  # type: ignore[union-attr]
        (call,) = stored(client, rollout_id)
    assert [(m["role"], m["content"]) for m in call.request["messages"]] == [  # type: ignore[index, union-attr]
        ("system", "You echo."),
        ("user", QUESTION["content"]),
        ("system", "Working directory: /w"),
    ]
    assert_exact(call, f"Echo: {QUESTION['content']}")


def test_count_tokens_is_the_model_servers_count_of_the_prompt_and_stores_nothing(server: ServerProcess) -> None:
    with Client(server.url) as client:
        rollout_id, llm, _ = attempt(server, client)
        counted = llm.messages.count_tokens(model="m", system=SYSTEM, messages=[QUESTION], tools=[CALC])  # type: ignore[list-item]
        # the same prompt as the call would have: its ids, as the model server's template renders them
        answer = llm.messages.create(model="m", max_tokens=64, system=SYSTEM, messages=[QUESTION], tools=[CALC])  # type: ignore[list-item]
        (call,) = stored(client, rollout_id)  # the count was not stored as a call
        assert counted.input_tokens == len(call.prompt_ids or []) == answer.usage.input_tokens
        with pytest.raises(anthropic.BadRequestError, match="messages\\[0\\]"):
            llm.messages.count_tokens(model="m", messages=[{"role": "tool", "content": "x"}])  # type: ignore[list-item, typeddict-item]


def test_refusals_come_in_anthropics_envelope(server: ServerProcess) -> None:
    with Client(server.url) as client:
        _, llm, attempt_id = attempt(server, client)
        missing = httpx.post(
            f"{str(llm.base_url).rstrip('/')}/v1/messages", json={"model": "m", "messages": [QUESTION]}
        )
        assert missing.status_code == 400 and "max_tokens is required" in missing.json()["error"]["message"]
        image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
        raw = httpx.post(
            f"{str(llm.base_url).rstrip('/')}/v1/messages",
            json={"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [image]}]},
        )
        assert raw.status_code == 400
        assert raw.json()["type"] == "error" and raw.json()["error"]["type"] == "invalid_request_error"
        assert "'image' is not supported" in raw.json()["error"]["message"]
        # an attempt that ended takes no more calls: the chat path's 409, in Anthropic's envelope
        httpx.post(f"{server.url}/api/v1/attempts/{attempt_id}/complete", json={"status": "succeeded"})
        with pytest.raises(anthropic.ConflictError, match="has ended"):
            llm.messages.create(model="m", max_tokens=8, messages=[QUESTION])


def test_an_import_time_client_reaches_agl_through_the_worker_with_a_token(tmp_path: Path, upstream: str) -> None:
    """ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY set by `agl worker`; with a server token, the attempt's own
    credential replaces the key at send time, whatever header the SDK puts it in."""
    token = "s3cret-token"
    server = start_server(tmp_path / "run", upstream=upstream, token=token)
    app = f"{Path(__file__).with_name('anthropic_app.py')}:ask"
    try:
        with Client(server.url, token=token) as client:
            ids = [r.id for r in client.enqueue({"q": "hi"}, n=2)]
            worker = start_worker(app, server.url, extra_args=[f"--token={token}"], log_path=tmp_path / "w.log")
            try:
                done = wait_rollouts(client, ids, timeout=120)
            finally:
                worker.terminate()
                worker.wait(15)
            assert [r.status.value for r in done] == ["succeeded", "succeeded"], (tmp_path / "w.log").read_text()[
                -2000:
            ]
            calls: list[Any] = [c for r in done for c in client.rollout_detail(r.id).llm_calls]
    finally:
        server.stop()
    assert len(calls) == 2 and all(c.agent_name == "asker" and c.trainable and c.route == "messages" for c in calls)
    assert all(c.model_requested == "claude-app-model" for c in calls)
