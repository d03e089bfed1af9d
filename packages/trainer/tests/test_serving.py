"""The engine's OpenAI-compatible front: vLLM-style ids and log-probs, streams that agree with complete
answers, clear 400s; and behind a real `agl serve` process, calls stored token-exact and trainable."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from agl.client import Client
from agl.common.processes import start_server
from agl_trainer.chat_format import render_prompt
from agl_trainer.engines.embedded import Engine
from agl_trainer.engines.serving import EngineServer

MESSAGES = [{"role": "user", "content": "Write one short sentence."}]


@pytest.fixture
def front(engine: Engine) -> Iterator[EngineServer]:
    with EngineServer(engine) as server:
        yield server


def post(front: EngineServer, body: dict[str, Any] | bytes) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(
        f"{front.url}/chat/completions", content=content, headers={"content-type": "application/json"}, timeout=60
    )


def sse(resp: httpx.Response) -> list[dict[str, Any]]:
    events = [line[6:] for line in resp.text.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_answers_carry_the_ids_the_engine_used(front: EngineServer, engine: Engine) -> None:
    body = post(
        front,
        {
            "model": "x",
            "messages": MESSAGES,
            "max_tokens": 8,
            "temperature": 0,
            "return_token_ids": True,
            "logprobs": True,
        },
    ).json()
    expected_prompt = engine.tokenizer(render_prompt(engine.tokenizer, MESSAGES), add_special_tokens=False).input_ids
    assert body["prompt_token_ids"] == list(expected_prompt)
    choice = body["choices"][0]
    assert 1 <= len(choice["token_ids"]) <= 8
    assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])
    assert choice["message"]["content"] == engine.tokenizer.decode(choice["token_ids"], skip_special_tokens=True)
    assert body["usage"]["completion_tokens"] == len(choice["token_ids"])
    plain = post(front, {"messages": MESSAGES, "max_tokens": 4}).json()
    assert "prompt_token_ids" not in plain and plain["choices"][0]["logprobs"] is None


@pytest.mark.parametrize("tools", [None, [{"type": "function", "function": {"name": "calculator", "parameters": {}}}]])
def test_streams_agree_with_complete_answers(front: EngineServer, tools: Any) -> None:
    request: dict[str, Any] = {
        "messages": MESSAGES,
        "max_tokens": 10,
        "temperature": 0,
        "return_token_ids": True,
        "logprobs": True,
    }
    if tools:
        request["tools"] = tools
    whole = post(front, request).json()
    chunks = sse(post(front, {**request, "stream": True, "stream_options": {"include_usage": True}}))
    assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    ids = [i for c in chunks for ch in c["choices"] for i in ch.get("token_ids", [])]
    assert ids == whole["choices"][0]["token_ids"]
    text = "".join(ch["delta"].get("content") or "" for c in chunks for ch in c["choices"])
    assert text == whole["choices"][0]["message"]["content"]
    lps = [e["logprob"] for c in chunks for ch in c["choices"] for e in (ch["logprobs"] or {}).get("content", [])]
    assert lps == pytest.approx([e["logprob"] for e in whole["choices"][0]["logprobs"]["content"]], abs=1e-6)
    assert [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]] == [
        whole["choices"][0]["finish_reason"]
    ]
    assert chunks[-1]["usage"] == whole["usage"]


def test_bad_requests_get_openai_style_400s(front: EngineServer, engine: Engine) -> None:
    cases = [
        (b"{nope", "not valid JSON"),
        ({"messages": []}, "messages"),
        ({"messages": MESSAGES, "n": 2}, "n > 1"),
        ({"messages": [{"role": "user", "content": "word " * (engine.max_context + 10)}]}, "maximum context length"),
    ]
    for body, words in cases:
        resp = post(front, body)
        assert resp.status_code == 400, body
        assert words in resp.json()["error"]["message"]
    assert httpx.get(f"{front.url}/models").json()["data"][0]["id"] == "agl-policy"


@pytest.mark.slow
def test_agl_serve_stores_engine_calls_token_exact(front: EngineServer, engine: Engine, tmp_path: Path) -> None:
    server = start_server(tmp_path / "run", upstream=front.url)
    try:
        with Client(server.url) as client:
            (rollout,) = client.enqueue("x")
            (claim,) = httpx.post(f"{server.url}/api/v1/claims", json={"worker_id": "w"}).json()
            base = f"{server.url}/rollout/{rollout.id}/attempt/{claim['attempt']['id']}/v1"
            llm = openai.OpenAI(base_url=base, api_key="k", max_retries=0)
            reply = llm.chat.completions.create(model="agl-policy", messages=MESSAGES, max_tokens=6)  # type: ignore[arg-type]
            streamed = llm.chat.completions.create(model="agl-policy", messages=MESSAGES, max_tokens=6, stream=True)  # type: ignore[arg-type]
            "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
            calls = sorted(client.rollout_detail(rollout.id).llm_calls, key=lambda c: c.seq)
        expected_prompt = list(
            engine.tokenizer(render_prompt(engine.tokenizer, MESSAGES), add_special_tokens=False).input_ids
        )
        assert [c.prompt_ids for c in calls] == [expected_prompt, expected_prompt]
        assert all(c.trainable and c.response_ids and len(c.logprobs or []) == len(c.response_ids) for c in calls)
        assert calls[0].response_message["content"] == reply.choices[0].message.content
    finally:
        server.stop()


def test_eval_rollouts_are_decoded_greedily(front: EngineServer) -> None:
    body = {"messages": MESSAGES, "max_tokens": 8, "return_token_ids": True, "temperature": 1.0}
    greedy = post(front, {**body, "temperature": 0}).json()["choices"][0]["token_ids"]
    answers = [
        httpx.post(
            f"{front.url}/chat/completions", json={**body, "seed": seed}, headers={"x-agl-rollout-mode": "eval"}
        ).json()["choices"][0]["token_ids"]
        for seed in range(3)
    ]
    assert answers == [greedy] * 3
