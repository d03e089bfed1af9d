"""An app's own model names under plain `agl serve`: mapped onto what the upstream serves (issue #29, friction 3).

A vLLM serving one model rejects `gpt-4o`; agl asks the upstream's `/v1/models` and, when it serves exactly one,
sends every call under that one (the name the app asked for is stored with the call). With several, an unknown
name is a 400 that lists them. `--upstream-model` still forces one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from agl.client import API, Client
from agl.common.asgi import ThreadedServer
from agl.common.processes import ServerProcess, start_server
from agl.testing.upstream import read_body, respond_json


def claim(server: ServerProcess) -> str:
    with Client(server.url) as client:
        client.enqueue("q")
    (found,) = httpx.post(f"{server.url}{API}/claims", json={"worker_id": "w"}).json()
    return f"{server.url}/rollout/{found['rollout']['id']}/attempt/{found['attempt']['id']}/v1"


def chat(url: str, model: str) -> httpx.Response:
    return httpx.post(
        f"{url}/chat/completions", json={"model": model, "messages": [{"role": "user", "content": "hi"}]}, timeout=30
    )


def stored_models(server: ServerProcess) -> list[tuple[str | None, str | None]]:
    with Client(server.url) as client:
        rollouts, _ = client.list_rollouts(limit=100)
        return [(c.model_requested, c.model) for r in rollouts for c in client.rollout_detail(r.id).llm_calls]


class TwoModels:
    """An upstream that serves two models and answers each chat with the model it was asked for (a vLLM with two
    served names would refuse any other)."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        if scope["path"].endswith("/models"):
            answer: Any = {"object": "list", "data": [{"id": "policy-a"}, {"id": "policy-b"}]}
        else:
            model = orjson.loads(body)["model"]
            self.asked.append(model)
            answer = {
                "id": "x",
                "object": "chat.completion",
                "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        await respond_json(send, 200, orjson.dumps(answer))


@pytest.fixture
def two_models() -> Iterator[tuple[str, TwoModels]]:
    app = TwoModels()
    with ThreadedServer(app, lifespan="off") as server:
        yield f"{server.url}/v1", app


def test_an_upstream_serving_one_model_gets_every_call_under_it(tmp_path: Path, upstream: str) -> None:
    server = start_server(tmp_path / "run", upstream=upstream)  # the scripted upstream serves "scripted"
    try:
        url = claim(server)
        assert chat(url, "gpt-4o").status_code == 200
        assert chat(url, "scripted").status_code == 200
        assert stored_models(server) == [("gpt-4o", "scripted"), ("scripted", "scripted")]
    finally:
        server.stop()


def test_with_several_models_an_unknown_name_is_refused_listing_them(
    tmp_path: Path, two_models: tuple[str, TwoModels]
) -> None:
    base, app = two_models
    server = start_server(tmp_path / "run", upstream=base, extra_args=["--token-ids=never"])
    try:
        url = claim(server)
        refused = chat(url, "gpt-4o")
        assert refused.status_code == 400
        message = refused.json()["error"]["message"]
        assert "policy-a, policy-b" in message and "--upstream-model" in message
        assert chat(url, "policy-b").status_code == 200
        assert app.asked == ["policy-b"]  # the refused call never reached the upstream
        assert stored_models(server) == [("policy-b", "policy-b")]  # and took no sequence number
    finally:
        server.stop()


def test_upstream_model_still_forces_one(tmp_path: Path, two_models: tuple[str, TwoModels]) -> None:
    base, app = two_models
    server = start_server(
        tmp_path / "run", upstream=base, extra_args=["--token-ids=never", "--upstream-model=policy-a"]
    )
    try:
        assert chat(claim(server), "gpt-4o").status_code == 200
        assert app.asked == ["policy-a"]
    finally:
        server.stop()


class SlowModelList:
    """The scripted upstream, whose `/models` takes 0.5 s (a loaded vLLM): the first calls arrive meanwhile."""

    def __init__(self) -> None:
        from agl.testing.upstream import ScriptedUpstream

        self.inner = ScriptedUpstream()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        import asyncio

        if scope["type"] == "http" and scope["path"].endswith("/models"):
            await asyncio.sleep(0.5)
        await self.inner(scope, receive, send)


def test_calls_that_come_together_first_all_go_out_under_the_served_model(tmp_path: Path) -> None:
    """The first calls of a run come at once: those that arrived while the proxy was asking the upstream for its
    models went out under the app's name (a real vLLM refuses it; the scripted one answers under it), and were
    stored as served by a model that never served them. They wait for the answer, and the stored model is the one
    the upstream's answer names."""
    import threading

    with ThreadedServer(SlowModelList(), lifespan="off") as upstream:
        server = start_server(tmp_path / "run", upstream=f"{upstream.url}/v1")
        try:
            urls = [claim(server) for _ in range(8)]
            statuses: list[int] = []
            threads = [
                threading.Thread(target=lambda u=u: statuses.append(chat(u, "gpt-5.6-luna").status_code)) for u in urls
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert statuses == [200] * 8
            assert stored_models(server) == [("gpt-5.6-luna", "scripted")] * 8
        finally:
            server.stop()
