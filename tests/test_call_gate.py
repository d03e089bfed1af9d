"""The proxy's call meter and gate (agl.server.call_gate), through a real `agl serve` and a scripted upstream that
takes 0.4 s per answer: what the trainer's overlap figures and its in-place weight changes rely on.

- the meter counts calls in flight, the seconds with at least one in flight, and the tokens they generated;
- holding the gate waits for the calls in flight to be stored; a call arriving meanwhile waits and is stored
  under the version published before the release, never the one it arrived under;
- a hold that cannot drain in time is refused and leaves the gate open; a hold nobody releases lapses;
- no hold freezes the agents (issue #41): the server keeps new calls waiting for a drain no longer than its
  `--hold-drain-timeout`, a trainer that hangs up during the drain releases the gate, and agl's client tries a
  refused hold again and renews a short one while it holds it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from agl.client import AglHTTPError, Client
from agl.common.processes import ServerProcess, start_server
from agl.schema import ModelVersionIn
from agl.testing.upstream import start_upstream_process

DELAY_S = 0.4


def upstream_taking(delay_s: float) -> Iterator[str]:
    """A scripted upstream process answering after `delay_s`, for a module-scoped fixture."""
    proc, url = start_upstream_process(delay_s=delay_s)
    yield url
    proc.terminate()
    proc.wait(10)


def server_and_client(
    run_dir: Path, upstream: str, extra_args: list[str] | None = None
) -> Iterator[tuple[ServerProcess, Client]]:
    server = start_server(run_dir, upstream=upstream, extra_args=extra_args)
    with Client(server.url) as client:
        yield server, client
    server.stop()


@pytest.fixture(scope="module")
def slow_upstream() -> Iterator[str]:
    yield from upstream_taking(DELAY_S)


@pytest.fixture
def gated(tmp_path: Path, slow_upstream: str) -> Iterator[tuple[ServerProcess, Client]]:
    yield from server_and_client(tmp_path / "run", slow_upstream)


def attempt_base(server: ServerProcess, client: Client) -> tuple[str, str]:
    (rollout,) = client.enqueue("x")
    (claim,) = httpx.post(f"{server.url}/api/v1/claims", json={"worker_id": "w"}).json()
    return rollout.id, f"{server.url}/rollout/{rollout.id}/attempt/{claim['attempt']['id']}/v1"


def chat(base_url: str, out: list[Any]) -> None:
    llm = openai.OpenAI(base_url=base_url, api_key="k", max_retries=0)
    out.append(llm.chat.completions.create(model="m", messages=[{"role": "user", "content": "say three words"}]))


def in_background(base_url: str, out: list[Any]) -> threading.Thread:
    thread = threading.Thread(target=chat, args=(base_url, out))
    thread.start()
    return thread


def wait_in_flight(client: Client, n: int) -> None:
    deadline = time.monotonic() + 10
    while client.proxy_usage()["in_flight"] != n:
        assert time.monotonic() < deadline, client.proxy_usage()
        time.sleep(0.01)


def test_the_meter_counts_busy_time_calls_and_generated_tokens(gated: tuple[ServerProcess, Client]) -> None:
    server, client = gated
    _, base = attempt_base(server, client)
    usage = client.proxy_usage()
    assert {k: v for k, v in usage.items() if k != "engines"} == {
        "in_flight": 0,
        "busy_s": 0.0,
        "calls": 0,
        "completion_tokens": 0,
        "held": False,
    }
    assert [e["calls"] for e in usage["engines"]] == [0]
    answers: list[Any] = []
    threads = [in_background(base, answers) for _ in range(3)]  # three at once: busy ≈ one delay, not three
    for t in threads:
        t.join()
    time.sleep(0.6)  # idle: not counted
    chat(base, answers)
    usage = client.proxy_usage()
    assert usage["in_flight"] == 0 and usage["calls"] == 4
    assert usage["completion_tokens"] == sum(a.usage.completion_tokens for a in answers) > 0
    # two delays plus the proxy's own work; counting the three calls apart (4 delays) or the idle gap (≥ 3.5)
    # would pass 3 delays, which leaves a loaded CI machine room for the proxy's overhead
    assert 2 * DELAY_S * 0.9 < usage["busy_s"] < 3 * DELAY_S


def test_a_held_call_waits_and_is_stored_under_the_version_published_before_the_release(
    gated: tuple[ServerProcess, Client],
) -> None:
    server, client = gated
    client.publish_model_version(ModelVersionIn(name="step-0"))
    rollout_id, base = attempt_base(server, client)
    first: list[Any] = []
    running = in_background(base, first)
    wait_in_flight(client, 1)
    start = time.monotonic()
    with client.calls_held() as held:
        drained_after = time.monotonic() - start
        assert client.proxy_usage()["in_flight"] == 0  # the hold returned once the call was answered
        # the answer reaches the agent's thread just after the server counts the call done
        deadline = time.monotonic() + 5
        while not first and time.monotonic() < deadline:
            time.sleep(0.01)
        assert first
        assert held["held"] and drained_after > DELAY_S * 0.5
        late: list[Any] = []
        waiting = in_background(base, late)
        time.sleep(0.3)
        assert not late and client.proxy_usage() == {**client.proxy_usage(), "in_flight": 0, "held": True}
        new = client.publish_model_version(ModelVersionIn(name="step-1"))  # the weights changed meanwhile
    waiting.join(10)
    running.join(10)
    assert late and client.proxy_usage()["held"] is False
    calls = sorted(client.rollout_detail(rollout_id).llm_calls, key=lambda c: c.seq)
    assert [c.model_version for c in calls] == [new.version - 1, new.version]


def test_a_hold_that_cannot_drain_in_time_is_refused_and_calls_flow(gated: tuple[ServerProcess, Client]) -> None:
    server, client = gated
    _, base = attempt_base(server, client)
    answers: list[Any] = []
    running = in_background(base, answers)
    wait_in_flight(client, 1)
    with pytest.raises(AglHTTPError, match=r"still in flight after 0\.05 s"), client.calls_held(drain_timeout_s=0.05):
        pass
    assert client.proxy_usage()["held"] is False
    for bad in ({"max_hold_s": 0}, {"drain_timeout_s": -1}, {"max_hold_s": "soon"}):
        refused = httpx.post(f"{server.url}/api/v1/proxy/hold", params=bad, json={})
        assert refused.status_code == 422 and next(iter(bad)) in refused.json()["error"]["message"]
    assert client.proxy_usage()["held"] is False
    chat(base, answers)  # not held: answered in about one delay
    running.join(10)
    assert len(answers) == 2


def test_a_hold_nobody_releases_lapses(gated: tuple[ServerProcess, Client]) -> None:
    server, client = gated
    _, base = attempt_base(server, client)
    httpx.post(f"{server.url}/api/v1/proxy/hold", params={"max_hold_s": 0.5}, json={}).raise_for_status()
    answers: list[Any] = []
    start = time.monotonic()
    chat(base, answers)
    assert answers and 0.5 <= time.monotonic() - start < 0.5 + DELAY_S + 2
    assert client.proxy_usage()["held"] is False


# ---------------------------------------------------------------------- a hold cannot freeze the agents (issue #41)

LONG_S = 3.0  # a call in flight this long: longer than the drain bound below


@pytest.fixture(scope="module")
def very_slow_upstream() -> Iterator[str]:
    yield from upstream_taking(LONG_S)


@pytest.fixture
def bounded(tmp_path: Path, very_slow_upstream: str) -> Iterator[tuple[ServerProcess, Client]]:
    yield from server_and_client(tmp_path / "run", very_slow_upstream, ["--hold-drain-timeout=0.5"])


def test_a_drain_keeps_new_calls_waiting_no_longer_than_the_servers_bound(
    bounded: tuple[ServerProcess, Client],
) -> None:
    server, client = bounded
    _, base = attempt_base(server, client)
    running = in_background(base, [])
    wait_in_flight(client, 1)
    start = time.monotonic()
    # the trainer would wait up to 600 s; the server lets new calls wait 0.5 s at most, then opens the gate
    refused = httpx.post(f"{server.url}/api/v1/proxy/hold", params={"drain_timeout_s": 600}, json={}, timeout=30)
    assert refused.status_code == 409 and "after 0.5 s" in refused.text, refused.text
    assert time.monotonic() - start < 2.5 and client.proxy_usage()["held"] is False
    running.join(10)


def test_a_trainer_that_hangs_up_while_its_hold_drains_releases_it(bounded: tuple[ServerProcess, Client]) -> None:
    server, client = bounded
    _, base = attempt_base(server, client)
    running = in_background(base, [])
    wait_in_flight(client, 1)
    with pytest.raises(httpx.ReadTimeout):  # gone after 0.2 s, well before the 0.5-s drain bound
        httpx.post(f"{server.url}/api/v1/proxy/hold", params={"drain_timeout_s": 0.45}, json={}, timeout=0.2)
    time.sleep(0.1)
    assert client.proxy_usage()["held"] is False
    running.join(10)


def test_the_clients_hold_retries_a_refused_drain_and_renews_itself_while_held(
    bounded: tuple[ServerProcess, Client],
) -> None:
    server, client = bounded
    _, base = attempt_base(server, client)
    first: list[Any] = []
    running = in_background(base, first)
    wait_in_flight(client, 1)
    start = time.monotonic()
    # refused while the 3-s call runs (the gate opening between tries), held once it is answered
    with client.calls_held(drain_timeout_s=30, max_hold_s=1.0) as held:
        assert held["held"] and first and time.monotonic() - start >= LONG_S * 0.8
        time.sleep(2.5)  # past the 1-s lapse: renewed meanwhile, so still held
        assert client.proxy_usage()["held"] is True
    assert client.proxy_usage()["held"] is False
    running.join(10)
