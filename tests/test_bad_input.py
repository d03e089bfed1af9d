"""Bad input gets a 4xx that names the problem, and nothing already stored is lost; upstream errors reach the
agent as OpenAI-style errors and are recorded; a non-loopback bind requires a token on every route."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

import agl
from agl.client import Client
from agl.common.processes import ServerProcess, start_server
from tests.conftest import run_cli

API = "/api/v1"


@pytest.fixture
def stored(server: ServerProcess, client: Client) -> dict[str, Any]:
    """Something already in the store, claimed and with a span and a reward, to check it survives bad requests."""
    (rollout,) = client.enqueue({"question": "keep me"})
    claim = httpx.post(f"{server.url}{API}/claims", json={"worker_id": "w", "max_rollouts": 1}).json()[0]
    attempt = claim["attempt"]["id"]
    span = {
        "trace_id": "a" * 32,
        "span_id": "b" * 16,
        "name": "kept",
        "start_time": 1.0,
        "end_time": 2.0,
        "rollout_id": rollout.id,
        "attempt_id": attempt,
    }
    assert httpx.post(f"{server.url}{API}/spans", json={"spans": [span]}).status_code == 200
    reward = {"rollout_id": rollout.id, "attempt_id": attempt, "value": 0.5, "name": "kept"}
    assert httpx.post(f"{server.url}{API}/rewards", json=[reward]).status_code == 200
    return {"rollout": rollout.id, "attempt": attempt, "span": span, "reward": reward}


def assert_intact(client: Client, stored: dict[str, Any]) -> None:
    detail = client.rollout_detail(stored["rollout"])
    assert [s.name for s in detail.spans] == ["kept"]
    assert [(r.name, r.value) for r in detail.rewards] == [("kept", 0.5)]
    assert detail.rollout.status.value == "running"


def error_of(resp: httpx.Response) -> str:
    body = resp.json()
    assert set(body["error"]) >= {"message", "type"}, body
    return str(body["error"]["message"])


BAD_REQUESTS = [
    # (method, path, body (bytes or JSON), expected status, words the message must contain)
    ("POST", f"{API}/rollouts", b"{not json", 422, ["not valid JSON"]),
    ("POST", f"{API}/rollouts", {"task": {"input": "x"}, "n": "many"}, 422, ["n"]),
    ("POST", f"{API}/rollouts", {"task": {"input": "x"}, "n": 0}, 422, ["n", "greater than or equal to 1"]),
    ("POST", f"{API}/rollouts", {"task": {"input": "x"}, "colour": "red"}, 422, ["colour"]),
    ("POST", f"{API}/rollouts", {"task_id": "task-nope"}, 404, ["task-nope"]),
    ("GET", f"{API}/rollouts/ro-nope", None, 404, ["ro-nope"]),
    ("POST", f"{API}/attempts/at-nope/complete", {"status": "succeeded"}, 404, ["at-nope"]),
    ("POST", f"{API}/attempts/at-nope/heartbeat", {}, 404, ["at-nope"]),
    (
        "POST",
        f"{API}/spans",
        {"spans": [{"trace_id": "xyz", "span_id": "b" * 16, "name": "s", "start_time": 1, "end_time": 2}]},
        422,
        ["trace_id"],
    ),
    (
        "POST",
        f"{API}/spans",
        {"spans": [{"trace_id": "c" * 32, "span_id": "d" * 16, "name": "s", "start_time": 2, "end_time": 1}]},
        422,
        ["end_time", "before start_time"],
    ),
    ("POST", "/v1/traces", b"\x00garbage", 400, ["OTLP"]),
    ("POST", "/rollout/ro-nope/attempt/at-nope/v1/chat/completions", {"messages": []}, 404, ["at-nope"]),
]


@pytest.mark.parametrize(("method", "path", "body", "status", "words"), BAD_REQUESTS)
def test_bad_request_is_refused_with_a_message_and_loses_nothing(
    server: ServerProcess,
    client: Client,
    stored: dict[str, Any],
    method: str,
    path: str,
    body: Any,
    status: int,
    words: list[str],
) -> None:
    content = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    headers = {"content-type": "application/x-protobuf" if path == "/v1/traces" else "application/json"}
    resp = httpx.request(method, server.url + path, content=content, headers=headers)
    assert resp.status_code == status, resp.text
    message = error_of(resp)
    for word in words:
        assert word in message, message
    assert_intact(client, stored)


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_reward_is_refused(
    server: ServerProcess, client: Client, stored: dict[str, Any], value: str
) -> None:
    body = f'[{{"rollout_id": "{stored["rollout"]}", "attempt_id": "{stored["attempt"]}", "value": {value}}}]'
    resp = httpx.post(f"{server.url}{API}/rewards", content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 422
    assert "value" in error_of(resp) and "finite" in error_of(resp)
    assert_intact(client, stored)
    with pytest.raises(ValueError, match="finite"):
        agl.emit_reward(math.nan)


def test_proxy_refuses_malformed_chat_requests(server: ServerProcess, stored: dict[str, Any]) -> None:
    base = f"{server.url}/rollout/{stored['rollout']}/attempt/{stored['attempt']}/v1/chat/completions"
    resp = httpx.post(base, content=b"{oops", headers={"content-type": "application/json"})
    assert resp.status_code == 400 and "not valid JSON" in error_of(resp)
    resp = httpx.post(base, json={"model": "m"})
    assert resp.status_code == 400 and "messages" in error_of(resp)
    wrong_rollout = base.replace(stored["rollout"], "ro-other")
    resp = httpx.post(wrong_rollout, json={"messages": [{"role": "user", "content": "hi"}]})
    assert resp.status_code == 404


def test_body_over_the_limit_is_refused(tmp_path: Path, upstream: str) -> None:
    srv = start_server(tmp_path / "run", upstream=upstream, extra_args=["--max-body-mb=0.01"])
    try:
        with Client(srv.url) as client:
            (kept,) = client.enqueue("kept")
            big = {"task": {"input": "x" * 20_000}}
            resp = httpx.post(f"{srv.url}{API}/rollouts", json=big)
            assert resp.status_code == 413 and "over the limit" in error_of(resp)

            def chunks() -> Any:  # no Content-Length: the limit is counted while the body streams in
                for _ in range(20):
                    yield b"x" * 1000

            resp = httpx.post(f"{srv.url}{API}/spans", content=chunks(), headers={"content-type": "application/json"})
            assert resp.status_code == 413
            assert [r.id for r in client.list_rollouts()[0]] == [kept.id]
    finally:
        srv.stop()


@agl.rollout
def erroring_agent(task: Any, llm: agl.LLM) -> float:
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    with agl.agent("unlucky"):
        try:
            client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": task}])
        except openai.APIStatusError as exc:
            agl.emit_reward(0.0, name="llm_error", status=exc.status_code, message=str(exc.message))
            return -1.0
    return 1.0


def test_upstream_error_reaches_the_agent_openai_style_and_is_recorded(server: ServerProcess, client: Client) -> None:
    (rollout,) = client.enqueue("force_error:503 please")
    stats = agl.Runner(erroring_agent, server.url, concurrency=1).run(max_rollouts=1)
    assert stats.succeeded == 1
    detail = client.rollout_detail(rollout.id)
    assert detail.rollout.final_reward == -1.0
    (reward,) = [r for r in detail.rewards if r.name == "llm_error"]
    assert reward.metadata["status"] == 503  # the agent saw the upstream's own status through the proxy
    (call,) = detail.llm_calls
    assert call.status == "error" and call.http_status == 503 and call.error
    assert call.agent_name == "unlucky" and not call.trainable


def test_unreachable_upstream_is_a_502_the_agent_can_read(tmp_path: Path) -> None:
    srv = start_server(tmp_path / "run", upstream="http://127.0.0.1:9/v1")  # nothing listens on port 9
    try:
        with Client(srv.url) as client:
            (rollout,) = client.enqueue("hello")
            stats = agl.Runner(erroring_agent, srv.url, concurrency=1).run(max_rollouts=1)
            assert stats.succeeded == 1
            detail = client.rollout_detail(rollout.id)
            (reward,) = [r for r in detail.rewards if r.name == "llm_error"]
            assert reward.metadata["status"] == 502 and "could not reach" in str(reward.metadata["message"])
            (call,) = detail.llm_calls
            assert call.http_status == 502 and "unreachable" in (call.error or "")
    finally:
        srv.stop()


def test_non_loopback_bind_requires_a_token_on_every_route(tmp_path: Path, upstream: str) -> None:
    refused = subprocess.run(
        [sys.executable, "-m", "agl.cli.main", "serve", f"--run-dir={tmp_path / 'x'}", "--host=0.0.0.0", "--port=0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "AGL_TOKEN"},
    )
    assert refused.returncode != 0 and "token" in refused.stderr

    srv = start_server(tmp_path / "run", upstream=upstream, host="0.0.0.0", token="s3cret")
    try:
        url = f"http://127.0.0.1:{srv.port}"
        routes = [
            ("GET", f"{API}/info"),
            ("GET", f"{API}/rollouts"),
            ("POST", f"{API}/rollouts"),
            ("GET", "/docs"),
            ("GET", "/openapi.json"),
            ("POST", "/v1/traces"),
            ("GET", "/v1/models"),
            ("POST", "/rollout/r/attempt/a/v1/chat/completions"),
        ]
        for method, path in routes:
            assert httpx.request(method, url + path).status_code == 401, path
            wrong = httpx.request(method, url + path, headers={"authorization": "Bearer nope"})
            assert wrong.status_code == 401, path
        assert "Bearer" in error_of(httpx.get(url + f"{API}/info"))
        with Client(url, token="s3cret") as client:
            assert client.info()["auth"] is True
            (rollout,) = client.enqueue("q")
            assert client.get_rollout(rollout.id).status.value == "queued"
    finally:
        srv.stop()


def test_openapi_document_is_served(server: ServerProcess) -> None:
    doc = httpx.get(f"{server.url}/openapi.json").json()
    for path in (
        f"{API}/rollouts",
        f"{API}/claims",
        f"{API}/spans",
        "/v1/traces",
        "/rollout/{rollout_id}/attempt/{attempt_id}/v1/chat/completions",
    ):
        assert path in doc["paths"], path


@pytest.mark.parametrize("command", ["serve", "worker", "enqueue", "rollouts", "show", "export"])
def test_every_command_has_help(command: str) -> None:
    out = run_cli(command, "--help").stdout
    assert out.startswith("Usage: ") and command in out and "--help" in out
    assert len(out.splitlines()) >= 5


def test_cli_names_an_unknown_rollout(server: ServerProcess) -> None:
    result = run_cli("show", "ro-nope", f"--server={server.url}", check=False)
    assert result.returncode != 0 and "ro-nope" in result.stderr
