"""The OpenAI Responses API on agl's proxy: a real `agl serve` with the scripted upstream, called with the real
`openai` client — not streamed and streamed, with a function tool, its call and the call's output — recorded with
exact token ids like a chat completion; unknown OpenAI routes get a 404 that lists what the proxy serves."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from agl.client import Client
from agl.common.processes import ServerProcess, start_server
from agl.schema import LLMCall
from agl.testing.upstream import encode, render_prompt

CALC = {
    "type": "function",
    "name": "calculator",
    "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
}


@pytest.fixture
def server(tmp_path: Path, upstream: str) -> Iterator[ServerProcess]:
    proc = start_server(tmp_path / "run", upstream=upstream)
    yield proc
    proc.stop()


def attempt(server: ServerProcess, client: Client) -> tuple[str, openai.OpenAI]:
    (rollout,) = client.enqueue("x")
    (claim,) = httpx.post(f"{server.url}/api/v1/claims", json={"worker_id": "w"}).json()
    base = f"{server.url}/rollout/{rollout.id}/attempt/{claim['attempt']['id']}/v1"
    return rollout.id, openai.OpenAI(base_url=base, api_key="k", max_retries=0)


def stored(client: Client, rollout_id: str) -> list[LLMCall]:
    return sorted(client.rollout_detail(rollout_id).llm_calls, key=lambda c: c.seq)


def assert_exact(call: LLMCall, text: str) -> None:
    """The call is trainable, with the ids the backend's tokenizer gives its prompt and answer."""
    assert call.trainable and call.status == "ok"
    assert call.prompt_ids == encode(render_prompt(call.request["messages"], call.request.get("tools")))
    assert call.response_ids == encode(text)
    assert call.logprobs is not None and len(call.logprobs) == len(call.response_ids)


def test_a_tool_call_and_its_output_round_trip_and_are_recorded_exactly(server: ServerProcess) -> None:
    with Client(server.url) as client:
        rollout_id, llm = attempt(server, client)
        first = llm.responses.create(
            model="m",
            instructions="You are a calculator.",
            input="What is 3 * 4?",
            tools=[CALC],  # type: ignore[list-item]
        )
        (call_item,) = first.output
        assert call_item.type == "function_call" and call_item.name == "calculator"
        assert json.loads(call_item.arguments) == {"expression": "3*4"}
        assert first.status == "completed" and first.usage is not None and first.usage.output_tokens > 0

        second = llm.responses.create(
            model="m",
            instructions="You are a calculator.",
            input=[
                {"role": "user", "content": "What is 3 * 4?"},
                {
                    "type": "function_call",
                    "call_id": call_item.call_id,
                    "name": "calculator",
                    "arguments": call_item.arguments,
                },
                {"type": "function_call_output", "call_id": call_item.call_id, "output": "12"},
            ],
            tools=[CALC],  # type: ignore[list-item]
        )
        assert second.output_text == "The answer is 12"
        calls = stored(client, rollout_id)
    assert len(calls) == 2
    # stored as the chat request it was translated to: instructions first, the call and its output as a chat
    assert calls[1].request["messages"][0] == {"role": "system", "content": "You are a calculator."}
    assert calls[1].request["messages"][2]["tool_calls"][0]["id"] == call_item.call_id
    assert calls[1].request["messages"][3] == {"role": "tool", "tool_call_id": call_item.call_id, "content": "12"}
    assert calls[1].request["tools"][0]["function"]["name"] == "calculator"
    assert_exact(calls[1], "The answer is 12")
    assert calls[0].response_message is not None and calls[0].response_message["tool_calls"]


def test_a_streamed_response_sends_the_responses_events_and_is_recorded(server: ServerProcess) -> None:
    with Client(server.url) as client:
        rollout_id, llm = attempt(server, client)
        events = list(llm.responses.create(model="m", input="good morning", stream=True))
        calls = stored(client, rollout_id)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds and "response.output_item.done" in kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "Echo: good morning" == events[-1].response.output_text
    (call,) = calls
    assert_exact(call, "Echo: good morning")
    # recorded as the agent called it: the Responses API, streamed
    assert (call.route, call.stream) == ("responses", True)


def test_each_call_records_its_route_and_whether_the_agent_streamed(server: ServerProcess) -> None:
    with Client(server.url) as client:
        rollout_id, llm = attempt(server, client)
        llm.responses.create(model="m", input="one")
        llm.chat.completions.create(model="m", messages=[{"role": "user", "content": "two"}])
        list(llm.chat.completions.create(model="m", messages=[{"role": "user", "content": "three"}], stream=True))
        calls = stored(client, rollout_id)
    assert [(c.route, c.stream) for c in calls] == [("responses", False), ("chat", False), ("chat", True)]
    shown = subprocess.run(
        [sys.executable, "-m", "agl.cli.main", "show", rollout_id, f"--server={server.url}"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "LLM #0" in shown and "responses" in shown.split("LLM #0")[1].split("\n")[0]
    assert "streamed" in shown.split("LLM #2")[1].split("\n")[0]
    page = httpx.get(f"{server.url}/ui/rollouts/{rollout_id}").text
    assert "responses ·" in page and "chat, streamed ·" in page


def test_a_streamed_tool_call_sends_its_arguments(server: ServerProcess) -> None:
    with Client(server.url) as client:
        _, llm = attempt(server, client)
        events = list(llm.responses.create(model="m", input="What is 6 - 2?", tools=[CALC], stream=True))  # type: ignore[list-item]
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and "6-2" in done[0].arguments
    final = events[-1].response.output
    assert [item.type for item in final] == ["function_call"]


def test_what_the_proxy_cannot_translate_is_refused_with_the_reason(server: ServerProcess) -> None:
    with Client(server.url) as client:
        rollout_id, llm = attempt(server, client)
        with pytest.raises(openai.BadRequestError, match="web_search"):
            llm.responses.create(model="m", input="hi", tools=[{"type": "web_search"}])  # type: ignore[list-item]
        assert stored(client, rollout_id) == []


@pytest.mark.parametrize("stream", [False, True])
def test_a_turn_continues_from_its_previous_response(server: ServerProcess, stream: bool) -> None:
    """`previous_response_id` (Agno's and the Agents SDK's server-side state): the second turn sends only the tool's
    output; agl serves the rest from the store (the first call's messages and answer), so the model sees the whole
    conversation and the call is stored as the chat request it means, exactly, with the answer's id kept."""
    with Client(server.url) as client:
        rollout_id, llm = attempt(server, client)
        first = llm.responses.create(
            model="m",
            instructions="You are a calculator.",
            input="What is 3 * 4?",
            tools=[CALC],  # type: ignore[list-item]
        )
        (call_item,) = first.output
        assert first.id.startswith("resp_")
        output = {"type": "function_call_output", "call_id": call_item.call_id, "output": "12"}
        if stream:
            events = list(
                llm.responses.create(
                    model="m",
                    instructions="You are a calculator.",
                    previous_response_id=first.id,
                    input=[output],  # type: ignore[list-item]
                    tools=[CALC],  # type: ignore[list-item]
                    stream=True,
                )
            )
            second = events[-1].response
        else:
            second = llm.responses.create(
                model="m",
                instructions="You are a calculator.",
                previous_response_id=first.id,
                input=[output],  # type: ignore[list-item]
                tools=[CALC],  # type: ignore[list-item]
            )
        assert second.output_text == "The answer is 12" and second.previous_response_id == first.id
        third = llm.responses.create(model="m", previous_response_id=second.id, input="And 3 * 5?")
        calls = stored(client, rollout_id)
    assert third.output_text and len(calls) == 3
    messages = calls[1].request["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
    assert messages[0] == {"role": "system", "content": "You are a calculator."}  # this turn's, once
    assert messages[2]["tool_calls"][0]["id"] == call_item.call_id
    assert_exact(calls[1], "The answer is 12")
    # the third turn gave no instructions: the earlier ones are not carried over (as OpenAI does)
    assert [m["role"] for m in calls[2].request["messages"]] == ["user", "assistant", "tool", "assistant", "user"]
    assert calls[2].trainable


def test_a_previous_response_agl_does_not_hold_is_answered_as_openai_does(server: ServerProcess) -> None:
    """An id agl never gave, or another attempt's: OpenAI's 400 (`previous_response_not_found`), on which clients
    that keep their own history fall back to sending it (Agno matches "previous response ... not found" on a 400).
    Nothing is stored."""
    with Client(server.url) as client:
        rollout_id, llm = attempt(server, client)
        first = llm.responses.create(model="m", input="What is 3 * 4?")
        _, other = attempt(server, client)
        for previous in ("resp_1", "resp_x_y", first.id.replace("resp_0_", "resp_7_")):
            with pytest.raises(openai.BadRequestError) as caught:
                llm.responses.create(model="m", input="hi", previous_response_id=previous)
            assert caught.value.code == "previous_response_not_found"
            assert caught.value.param == "previous_response_id" and previous in caught.value.message
        with pytest.raises(openai.BadRequestError, match="not found"):
            other.responses.create(model="m", input="hi", previous_response_id=first.id)
        assert len(stored(client, rollout_id)) == 1


@pytest.mark.parametrize("where", ["rollout", "fixed"])
def test_an_unknown_openai_route_gets_a_404_listing_the_routes(server: ServerProcess, where: str) -> None:
    with Client(server.url) as client:
        _, llm = attempt(server, client)
    if where == "fixed":
        llm = openai.OpenAI(base_url=f"{server.url}/v1", api_key="k", max_retries=0)
    with pytest.raises(openai.NotFoundError) as info:
        llm.embeddings.create(model="m", input="hi")
    message: Any = info.value.message
    assert "/embeddings" in message and "POST /v1/responses" in message and "POST /v1/chat/completions" in message
    body = info.value.body
    assert isinstance(body, dict) and body.get("code") == "unknown_route"


def test_agnos_responses_model_chains_its_turns_through_agl(server: ServerProcess) -> None:
    """Agno's `OpenAIResponses` continues each turn of a reasoning model (gpt-5, o3: the ones it chains) with
    `previous_response_id`: its second
    call, after the tool ran, sends only the tool's output. agl serves the rest; before, it refused the chained
    turn with a 400 Agno did not recognise, and the cookbook's agent failed after its first turn."""
    pytest.importorskip("agno")
    from agno.agent import Agent
    from agno.models.openai import OpenAIResponses

    sent: list[dict[str, Any]] = []

    def record(request: httpx.Request) -> None:
        if request.url.path.endswith("/responses"):
            sent.append(json.loads(request.content))

    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression."""
        return str(eval(expression, {"__builtins__": {}}))  # the scripted model writes "3*4"

    with Client(server.url) as client:
        rollout_id, llm = attempt(server, client)
        model = OpenAIResponses(
            id="gpt-5",  # Agno chains turns for reasoning models only (`_using_reasoning_model`)
            base_url=str(llm.base_url),
            api_key="k",
            http_client=httpx.Client(event_hooks={"request": [record]}),
        )
        answer = Agent(model=model, tools=[calculator]).run("What is 3 * 4?")
        calls = stored(client, rollout_id)
    assert answer.content == "The answer is 12"
    assert len(sent) == 2 and "previous_response_id" not in sent[0]
    assert sent[1]["previous_response_id"].startswith("resp_0_")  # chained from agl's first answer
    assert [item.get("type") for item in sent[1]["input"]] == ["function_call_output"]  # only what is new
    assert len(calls) == 2 and all(c.trainable for c in calls)
    assert [m["role"] for m in calls[1].request["messages"]][-2:] == ["assistant", "tool"]
