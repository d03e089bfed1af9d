"""The server under hostile or careless input, each case a defect found by probing it (issue #14).

A real `agl serve` (and the scripted upstream) in every test: decompression bombs, DNS rebinding and cross-site
requests, calls for attempts that ended, clients that hang up, integers beyond 64 bits, requests the store
could not record, nonsense reports, the lock on the run directory, and credentials scoped to one attempt.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

import agl
from agl.client import API, Client
from agl.common.processes import ServerProcess, start_server
from agl.store import Store
from agl.testing.upstream import start_upstream_process


def claim(server: ServerProcess, token: str | None = None) -> dict[str, Any]:
    """Enqueue a rollout and claim it as a worker would: the claim, as JSON (with its credential, if any)."""
    with Client(server.url, token=token) as client:
        client.enqueue("q")
    auth = {"authorization": f"Bearer {token}"} if token else {}
    (found,) = httpx.post(f"{server.url}{API}/claims", json={"worker_id": "w"}, headers=auth).json()
    return dict(found)


def proxy_url(server: ServerProcess, c: dict[str, Any]) -> str:
    return f"{server.url}/rollout/{c['rollout']['id']}/attempt/{c['attempt']['id']}/v1"


def chat(url: str, key: str = "k", **body: Any) -> httpx.Response:
    payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}
    return httpx.post(f"{url}/chat/completions", json=payload, headers={"authorization": f"Bearer {key}"})


def message(resp: httpx.Response) -> str:
    return str(resp.json()["error"]["message"])


def calls_of(server: ServerProcess, rollout_id: str) -> list[Any]:
    with Client(server.url) as client:
        return client.rollout_detail(rollout_id).llm_calls


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


# ------------------------------------------------------------------------------- 1. decompression bomb


def test_a_gzip_bomb_is_refused_with_413_in_bounded_memory(tmp_path: Path, upstream: str) -> None:
    server = start_server(tmp_path / "run", upstream=upstream, extra_args=["--max-body-mb=8"])
    try:
        assert server.proc is not None
        before = peak_rss_mb(server.proc.pid)
        bomb = gzip.compress(b" " * (300 << 20))  # 300 MB of spaces in ~300 KB
        resp = httpx.post(
            f"{server.url}/v1/traces",
            content=bomb,
            headers={"content-type": "application/json", "content-encoding": "gzip"},
            timeout=120,
        )
        assert resp.status_code == 413 and "inflates past the limit" in message(resp)
        grew = peak_rss_mb(server.proc.pid) - before
        print(f"server peak RSS grew by {grew:.1f} MB for a {len(bomb) >> 10} KB bomb of 300 MB")
        assert grew < 64, grew  # the limit is 8 MB; inflating it all would be 300 MB
        small = gzip.compress(json.dumps({"resourceSpans": []}).encode())
        ok = httpx.post(
            f"{server.url}/v1/traces",
            content=small,
            headers={"content-type": "application/json", "content-encoding": "gzip"},
        )
        assert ok.status_code == 200
        # compressed bodies go to OTLP only
        other = httpx.post(
            f"{server.url}{API}/tasks",
            content=gzip.compress(b'{"input": 1}'),
            headers={"content-type": "application/json", "content-encoding": "gzip"},
        )
        assert other.status_code == 415
    finally:
        server.stop()


# ------------------------------------------------------------------------ 2. web pages cannot reach it


def test_dns_rebinding_and_cross_site_simple_requests_are_refused(server: ServerProcess, client: Client) -> None:
    rebound = httpx.get(f"{server.url}{API}/rollouts", headers={"host": "attacker.example"})
    assert rebound.status_code == 400 and "--allowed-host" in message(rebound)
    assert httpx.get(f"{server.url}{API}/rollouts", headers={"host": f"localhost:{server.port}"}).status_code == 200
    # a page may POST without a content type, or as text/plain, to anyone: none of it is taken
    span = {"resourceSpans": []}
    no_type = httpx.post(f"{server.url}/v1/traces", content=json.dumps(span).encode(), headers={"content-type": ""})
    assert no_type.status_code == 415
    (rollout,) = client.enqueue("q")
    plain = httpx.post(f"{server.url}{API}/rollouts/{rollout.id}/cancel", headers={"content-type": "text/plain"})
    assert plain.status_code == 415
    form = httpx.post(f"{server.url}{API}/rollouts", data={"task": "x"})
    assert form.status_code == 415
    cross = httpx.post(
        f"{server.url}{API}/rollouts/{rollout.id}/cancel", json={}, headers={"origin": "https://evil.example"}
    )
    assert cross.status_code == 403
    assert client.get_rollout(rollout.id).status.value == "queued"  # nothing changed
    assert client.cancel(rollout.id).status.value == "cancelled"  # agl's own client still can


def test_allowed_host_names_extend_the_list(tmp_path: Path, upstream: str) -> None:
    server = start_server(tmp_path / "run", upstream=upstream, extra_args=["--allowed-host=agl.internal"])
    try:
        assert httpx.get(f"{server.url}{API}/info", headers={"host": "agl.internal:80"}).status_code == 200
        assert httpx.get(f"{server.url}{API}/info", headers={"host": "other.internal"}).status_code == 400
    finally:
        server.stop()


# ----------------------------------------------------------------- 3. calls for attempts that ended


def test_the_proxy_refuses_calls_for_ended_attempts_and_stores_nothing(server: ServerProcess) -> None:
    c = claim(server)
    url = proxy_url(server, c)
    assert chat(url).status_code == 200
    done = httpx.post(f"{server.url}{API}/attempts/{c['attempt']['id']}/complete", json={"status": "succeeded"})
    assert done.status_code == 200
    late = chat(url)
    assert late.status_code == 409 and "has ended" in message(late)
    assert len(calls_of(server, c["rollout"]["id"])) == 1
    # the attempt of a cancelled rollout too
    other = claim(server)
    with Client(server.url) as client:
        client.cancel(other["rollout"]["id"])
    assert chat(proxy_url(server, other)).status_code == 409
    assert calls_of(server, other["rollout"]["id"]) == []


# ---------------------------------------------------------------------------- 4. clients that hang up


def test_calls_of_a_client_that_hung_up_are_not_trainable(tmp_path: Path) -> None:
    proc, slow = start_upstream_process(delay_s=3.0)
    server = start_server(tmp_path / "run", upstream=slow)
    try:
        c = claim(server)
        llm = openai.OpenAI(base_url=proxy_url(server, c), api_key="k", timeout=1, max_retries=2)
        with pytest.raises(openai.APITimeoutError):
            llm.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        time.sleep(0.5)
        calls = calls_of(server, c["rollout"]["id"])
        assert len(calls) == 3  # each try is recorded ...
        assert not any(call.trainable for call in calls)  # ... as abandoned, never as training data
        assert all("hung up" in (call.not_trainable_reason or "") for call in calls)
    finally:
        server.stop()
        proc.terminate()
        proc.wait(10)


def test_the_upstream_timeout_is_an_option(tmp_path: Path) -> None:
    proc, slow = start_upstream_process(delay_s=3.0)
    server = start_server(tmp_path / "run", upstream=slow, extra_args=["--upstream-timeout=1"])
    try:
        c = claim(server)
        t0 = time.monotonic()
        resp = chat(proxy_url(server, c))
        assert resp.status_code == 502 and time.monotonic() - t0 < 2.9
        (call,) = calls_of(server, c["rollout"]["id"])
        assert call.status == "error" and not call.trainable
    finally:
        server.stop()
        proc.terminate()
        proc.wait(10)


# -------------------------------------------------------------------- 5. integers beyond 64 bits


BIG = 2**64


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/tasks", {"input": {"n": BIG}}, "input"),
        ("/rollouts", {"task": {"input": "q"}, "step": 2**63}, "step"),
        ("/rollouts", {"task": {"input": "q", "metadata": {"x": [BIG]}}}, "metadata"),
    ],
)
def test_integers_beyond_64_bits_are_422_naming_the_field(
    server: ServerProcess, path: str, body: dict[str, Any], field: str
) -> None:
    resp = httpx.post(
        f"{server.url}{API}{path}", content=json.dumps(body), headers={"content-type": "application/json"}
    )
    assert resp.status_code == 422 and field in message(resp), resp.text


def test_integers_beyond_64_bits_in_reports_queries_and_otlp(server: ServerProcess) -> None:
    c = claim(server)
    rollout, attempt = c["rollout"]["id"], c["attempt"]["id"]
    reward = {"rollout_id": rollout, "attempt_id": attempt, "value": 0.5, "metadata": {"big": BIG}}
    assert httpx.post(f"{server.url}{API}/rewards", json=[reward]).status_code == 422
    span = {"trace_id": "a" * 32, "span_id": "b" * 16, "name": "s", "start_time": 1.0, "end_time": 2.0}
    big_span = {**span, "rollout_id": rollout, "attributes": {"n": BIG}}
    assert httpx.post(f"{server.url}{API}/spans", json={"spans": [big_span]}).status_code == 422
    done = httpx.post(f"{server.url}{API}/attempts/{attempt}/complete", json={"status": "failed", "after_llm_seq": BIG})
    assert done.status_code == 422 and "after_llm_seq" in message(done)
    for path in (f"{API}/rollouts?step={2**63}", f"{API}/export/llm_calls?step={2**63}"):
        resp = httpx.get(server.url + path)
        assert resp.status_code == 422 and "step" in message(resp), path
    otlp = {
        "resourceSpans": [
            {
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": "a" * 32,
                                "spanId": "b" * 16,
                                "name": "s",
                                "startTimeUnixNano": "1" * 400,
                                "endTimeUnixNano": "2" * 400,
                            }
                        ]
                    }
                ]
            }
        ]
    }
    resp = httpx.post(f"{server.url}/v1/traces", json=otlp)
    assert resp.status_code == 400 and "startTimeUnixNano" in message(resp)


@agl.rollout
def agent_with_a_huge_reward(task: Any, llm: agl.LLM) -> float:
    agl.emit_reward(0.5, big=BIG)
    return 1.0


def test_an_agent_whose_reward_cannot_be_stored_fails_at_once_with_the_reason(server: ServerProcess) -> None:
    with Client(server.url) as client:
        (rollout,) = client.enqueue("q", max_attempts=1)
        t0 = time.monotonic()
        stats = agl.Runner(agent_with_a_huge_reward, server.url, concurrency=1, heartbeat_s=0.5).run(max_rollouts=1)
        took = time.monotonic() - t0
        failed = client.get_rollout(rollout.id)
    assert stats.failed == 1 and took < 20  # no 120 s of retries and no lease running out
    assert failed.status.value == "failed" and "64 bits" in (failed.error or "")


# ------------------------------------------------------------------ 6. calls the store could not record


@pytest.mark.parametrize(
    ("body", "words"),
    [({"model": 123}, "'model' must be a string"), ({"n": "abc"}, "'n' must be an integer"), ({"n": [1]}, "'n'")],
)
def test_requests_the_store_could_not_record_are_refused_before_forwarding(
    server: ServerProcess, body: dict[str, Any], words: str
) -> None:
    c = claim(server)
    resp = chat(proxy_url(server, c), **body)
    assert resp.status_code == 400 and words in message(resp)
    assert calls_of(server, c["rollout"]["id"]) == []
    ok = chat(proxy_url(server, c))
    assert ok.status_code == 200 and ok.headers["x-agl-llm-seq"] == "0"  # no sequence number was used up


# ---------------------------------------------------------------------------------- 7. nonsense


def test_nonsense_reports_are_refused_at_the_edge(server: ServerProcess) -> None:
    c = claim(server)
    rollout, attempt = c["rollout"]["id"], c["attempt"]["id"]
    true_reward = httpx.post(
        f"{server.url}{API}/rewards", json=[{"rollout_id": rollout, "attempt_id": attempt, "value": True}]
    )
    assert true_reward.status_code == 422 and "boolean" in message(true_reward)
    negative = httpx.post(
        f"{server.url}{API}/attempts/{attempt}/complete", json={"status": "succeeded", "after_llm_seq": -5}
    )
    assert negative.status_code == 422 and "after_llm_seq" in message(negative)
    ghost = {"trace_id": "a" * 32, "span_id": "b" * 16, "name": "s", "start_time": 1.0, "end_time": 2.0}
    unknown = httpx.post(f"{server.url}{API}/spans", json={"spans": [{**ghost, "rollout_id": "ro-ghost"}]})
    assert unknown.status_code == 404 and "ro-ghost" in message(unknown)
    ghost_otlp = {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "agl.rollout_id", "value": {"stringValue": "ro-ghost"}}]},
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": "d" * 32,
                                "spanId": "e" * 16,
                                "name": "s",
                                "startTimeUnixNano": "1000000000",
                                "endTimeUnixNano": "2000000000",
                            }
                        ]
                    }
                ],
            }
        ]
    }
    assert httpx.post(f"{server.url}/v1/traces", json=ghost_otlp).status_code == 404
    far = {
        "resourceSpans": [
            {
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": "a" * 32,
                                "spanId": "b" * 16,
                                "name": "s",
                                "startTimeUnixNano": "1",
                                "endTimeUnixNano": str(int(1e308)),
                            }
                        ]
                    }
                ]
            }
        ]
    }
    assert httpx.post(f"{server.url}/v1/traces", json=far).status_code == 400
    # the agent's own rewards end with its attempt; rewards computed later from the trace (AIR) do not
    assert httpx.post(f"{server.url}{API}/attempts/{attempt}/complete", json={"status": "succeeded"}).is_success
    late = {"rollout_id": rollout, "attempt_id": attempt, "value": 1.0}
    refused = httpx.post(f"{server.url}{API}/rewards", json=[late])
    assert refused.status_code == 409 and "no longer report" in message(refused)
    air = httpx.post(f"{server.url}{API}/rewards", json=[{**late, "source": "automatic"}])
    assert air.status_code == 200


# ---------------------------------------------------------------------------------------- 8. smaller


def test_the_bearer_scheme_is_case_insensitive(tmp_path: Path, upstream: str) -> None:
    server = start_server(tmp_path / "run", upstream=upstream, token="s3cret")
    try:
        for scheme in ("Bearer", "bearer", "BEARER"):
            resp = httpx.get(f"{server.url}{API}/info", headers={"authorization": f"{scheme} s3cret"})
            assert resp.status_code == 200, scheme
        assert httpx.get(f"{server.url}{API}/info", headers={"authorization": "Basic s3cret"}).status_code == 401
    finally:
        server.stop()


def test_the_openapi_document_lists_the_error_answers(server: ServerProcess) -> None:
    doc = httpx.get(f"{server.url}/openapi.json").json()
    complete = doc["paths"][f"{API}/attempts/{{attempt_id}}/complete"]["post"]["responses"]
    assert {"400", "401", "404", "409", "413", "422"} <= set(complete)
    chat_route = doc["paths"]["/rollout/{rollout_id}/attempt/{attempt_id}/v1/chat/completions"]["post"]
    assert {"404", "409", "413"} <= set(chat_route["responses"])


def test_a_second_server_on_the_same_run_directory_is_refused(server: ServerProcess) -> None:
    second = subprocess.run(
        [sys.executable, "-m", "agl.cli.main", "serve", f"--run-dir={server.run_dir}", "--port=0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode != 0 and "in use by another agl serve" in second.stderr
    assert httpx.get(f"{server.url}{API}/info").status_code == 200  # the first one is untouched


def test_per_attempt_state_is_freed_when_attempts_end(tmp_path: Path) -> None:
    with Store(tmp_path) as store:
        from agl.schema import EnqueueRequest, TaskIn

        store.enqueue(EnqueueRequest(task=TaskIn(input="q"), n=3)).result()
        claims = store.claim("w", 3, 30).result()
        for c in claims:
            assert store.attempt_rollout(c.attempt.id) == (c.rollout.id, "train", True)
            store.next_llm_seq(c.attempt.id)
        store.complete(claims[0].attempt.id, "succeeded").result()
        store.cancel(claims[1].rollout.id).result()
        store.heartbeat(claims[2].attempt.id, 0.01).result()
        time.sleep(0.05)
        store.expire_leases(grace_s=0).result()
        assert store._attempt_rollout == {} and store._next_seq == {}
        assert store.attempt_rollout(claims[0].attempt.id) == (claims[0].rollout.id, "train", False)


# ----------------------------------------------------------------- 9. credentials scoped to one attempt


@pytest.fixture
def token_server(tmp_path: Path, upstream: str) -> Iterator[ServerProcess]:
    server = start_server(tmp_path / "run", upstream=upstream, token="operator")
    yield server
    server.stop()


def test_an_attempts_credential_opens_its_own_rollout_only(token_server: ServerProcess) -> None:
    mine = claim(token_server, "operator")
    other = claim(token_server, "operator")
    key = mine["credential"]
    assert key and key.startswith("agl-attempt.") and key != other["credential"]
    auth = {"authorization": f"Bearer {key}"}
    assert chat(proxy_url(token_server, mine), key).status_code == 200
    assert chat(proxy_url(token_server, other), key).status_code == 403
    rollout, attempt = mine["rollout"]["id"], mine["attempt"]["id"]
    own = {"rollout_id": rollout, "attempt_id": attempt, "value": 0.5}
    assert httpx.post(f"{token_server.url}{API}/rewards", json=[own], headers=auth).status_code == 200
    theirs = {"rollout_id": other["rollout"]["id"], "attempt_id": other["attempt"]["id"], "value": 1.0}
    assert httpx.post(f"{token_server.url}{API}/rewards", json=[theirs], headers=auth).status_code == 403
    for method, path, body in [
        ("GET", f"{API}/rollouts", None),
        ("GET", f"{API}/rollouts/{other['rollout']['id']}/detail", None),
        ("POST", f"{API}/attempts/{other['attempt']['id']}/complete", {"status": "succeeded"}),
        ("POST", f"{API}/rollouts/{other['rollout']['id']}/cancel", {}),
        ("POST", f"{API}/claims", {"worker_id": "w"}),
    ]:
        assert httpx.request(method, token_server.url + path, json=body, headers=auth).status_code == 403, path
    done = httpx.post(
        f"{token_server.url}{API}/attempts/{attempt}/complete", json={"status": "succeeded"}, headers=auth
    )
    assert done.status_code == 200
    forged = f"agl-attempt.{other['attempt']['id']}.{key.rsplit('.', 1)[1]}"
    assert chat(proxy_url(token_server, other), forged).status_code == 401


def test_workers_give_agents_their_llm_credential(token_server: ServerProcess) -> None:
    seen: list[str] = []

    @agl.rollout
    def record_key(task: Any, llm: agl.LLM) -> float:
        seen.append(llm.api_key)
        return 1.0

    with Client(token_server.url, token="operator") as client:
        client.enqueue("q")
    stats = agl.Runner(record_key, token_server.url, token="operator", concurrency=1).run(max_rollouts=1)
    assert stats.succeeded == 1 and seen and seen[0].startswith("agl-llm.") and "operator" not in seen[0]


# ---------------------------------------------------------------------------------- crash in flight


def test_every_acknowledged_write_survives_a_kill_in_the_middle_of_a_burst(server: ServerProcess) -> None:
    """Spans over OTLP and proxied calls in flight from several threads when the server is killed: every one
    the server answered 200 for is in the store after the restart."""
    c = claim(server)
    url = proxy_url(server, c)
    acked_spans: list[str] = []
    acked_calls: list[int] = []
    stop = threading.Event()

    def send_spans(worker: int) -> None:
        i = 0
        while not stop.is_set():
            span_id = f"{worker:04x}{i:012x}"
            doc = {
                "resourceSpans": [
                    {
                        "scopeSpans": [
                            {
                                "spans": [
                                    {
                                        "traceId": "c" * 32,
                                        "spanId": span_id,
                                        "name": "burst",
                                        "startTimeUnixNano": "1000000000",
                                        "endTimeUnixNano": "2000000000",
                                    }
                                ]
                            }
                        ]
                    }
                ]
            }
            try:
                if httpx.post(f"{server.url}/v1/traces", json=doc, timeout=5).status_code == 200:
                    acked_spans.append(span_id)
            except httpx.HTTPError:
                return
            i += 1

    def send_calls() -> None:
        while not stop.is_set():
            try:
                resp = chat(url)
            except httpx.HTTPError:
                return
            if resp.status_code == 200:
                acked_calls.append(int(resp.headers["x-agl-llm-seq"]))

    threads = [threading.Thread(target=send_spans, args=(w,)) for w in range(3)]
    threads += [threading.Thread(target=send_calls) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    server.kill()
    stop.set()
    for t in threads:
        t.join(10)
    assert acked_spans and acked_calls
    with Store(server.run_dir) as store:
        stored_spans = {s.span_id for s in store.spans(c["rollout"]["id"])} | {
            row[0] for row in store._reader().execute("SELECT span_id FROM spans WHERE rollout_id IS NULL")
        }
        stored_calls = {call.seq for call in store.llm_calls(c["rollout"]["id"])}
    assert set(acked_spans) <= stored_spans, len(set(acked_spans) - stored_spans)
    assert set(acked_calls) <= stored_calls, sorted(set(acked_calls) - stored_calls)
