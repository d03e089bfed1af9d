"""The proxy over several engines (agl.server.engines, issue #42): two scripted upstream processes, "one per node",
behind one real `agl serve`.

- an attempt's first call goes to the least busy engine, and all its calls to that one while it answers;
- the record names the engine that answered; usage is counted per engine, and the dashboard shows it;
- an engine that dies mid-call fails its call cleanly (a 502, stored once, not trainable); the next calls of its
  attempts go to the survivor; nothing is stored twice;
- the trainer adds and removes engines through the REST API; one engine behaves as before (no engine named).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agl.client import Client, NotFound
from agl.common.processes import ServerProcess, start_server
from agl.server.engines import EngineRouter
from agl.testing.upstream import start_upstream_process

DELAY_S = 0.3


@pytest.fixture
def two_engines() -> Iterator[list[tuple[Any, str]]]:
    started = [start_upstream_process(delay_s=DELAY_S) for _ in range(2)]
    yield started
    for proc, _ in started:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(10)


@pytest.fixture
def routed(tmp_path: Path, two_engines: list[tuple[Any, str]]) -> Iterator[tuple[ServerProcess, Client]]:
    urls = [url for _, url in two_engines]
    server = start_server(tmp_path / "run", extra_args=[f"--upstream={url}" for url in urls])
    with Client(server.url) as client:
        yield server, client
    server.stop()


def attempt(server: ServerProcess, client: Client) -> tuple[str, str]:
    (rollout,) = client.enqueue("x")
    (claim,) = httpx.post(f"{server.url}/api/v1/claims", json={"worker_id": "w", "lease_s": 600}).json()
    return rollout.id, f"{server.url}/rollout/{rollout.id}/attempt/{claim['attempt']['id']}/v1"


def chat(base: str, text: str = "hi") -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    return httpx.post(f"{base}/chat/completions", json=body, timeout=30)


def turns(base: str, n: int, out: list[int]) -> None:
    out.extend(chat(base, f"turn {i}").status_code for i in range(n))


def engines_of(client: Client, rollout_id: str) -> list[str | None]:
    return [c.engine for c in sorted(client.rollout_detail(rollout_id).llm_calls, key=lambda c: c.seq)]


def test_calls_spread_by_load_and_stay_with_their_attempts_engine(routed: tuple[ServerProcess, Client]) -> None:
    server, client = routed
    attempts = [attempt(server, client) for _ in range(4)]
    statuses: list[int] = []
    threads = [threading.Thread(target=turns, args=(base, 3, statuses)) for _, base in attempts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert statuses == [200] * 12
    used = [engines_of(client, rid) for rid, _ in attempts]
    assert all(len(set(e)) == 1 and e[0] is not None for e in used), used  # one engine per attempt, named
    # four attempts at once over two idle engines: two each (a loaded machine may start one late: at least one)
    per_engine = Counter(e[0] for e in used)
    assert len(per_engine) == 2, used
    usage = client.proxy_usage()
    assert sorted(e["calls"] for e in usage["engines"]) == sorted(3 * n for n in per_engine.values())
    assert usage["calls"] == 12
    assert sum(e["completion_tokens"] for e in usage["engines"]) == usage["completion_tokens"] > 0
    # the dashboard shows them: its overview page and its JSON API, an engine a row
    overview = httpx.get(f"{server.url}/ui/api/overview").json()
    assert sorted(e["calls"] for e in overview["engines"]) == sorted(e["calls"] for e in usage["engines"])
    page = httpx.get(f"{server.url}/ui").text
    assert "<h2>Engines</h2>" in page
    for e in usage["engines"]:
        assert f"<tr data-engine='{e['url']}'><td>{e['url']}</td><td>yes</td><td>0</td><td>{e['calls']}</td>" in page


def test_an_engine_that_dies_fails_its_call_once_and_its_attempts_move_on(
    routed: tuple[ServerProcess, Client], two_engines: list[tuple[Any, str]]
) -> None:
    server, client = routed
    rid, base = attempt(server, client)
    assert chat(base).status_code == 200
    (first,) = engines_of(client, rid)
    proc = next(p for p, url in two_engines if url.rstrip("/") == first)
    answer: list[httpx.Response] = []
    caller = threading.Thread(target=lambda: answer.append(chat(base, "the last words")))
    caller.start()
    time.sleep(DELAY_S / 2)  # in flight on the engine that now dies
    proc.kill()
    caller.join(30)
    assert answer[0].status_code == 502, answer[0].text
    # the next calls of the attempt go to the survivor, and every call is stored once
    assert [chat(base, f"after {i}").status_code for i in range(3)] == [200, 200, 200]
    calls = sorted(client.rollout_detail(rid).llm_calls, key=lambda c: c.seq)
    assert [c.seq for c in calls] == list(range(5))
    assert calls[1].status == "error" and calls[1].http_status == 502 and not calls[1].trainable
    survivor = next(url for _, url in two_engines if url.rstrip("/") != first).rstrip("/")
    assert [c.engine for c in calls[2:]] == [survivor] * 3 and all(c.trainable for c in calls[2:])
    dead = next(e for e in client.engines() if e["url"] == first)
    assert not dead["in_rotation"] and dead["failures"] >= 1 and dead["last_error"]


def test_the_trainer_adds_and_removes_engines(tmp_path: Path, two_engines: list[tuple[Any, str]]) -> None:
    (_, one), (_, two) = two_engines
    (tmp_path / "admin").write_text("the trainer's admin token")  # engines change only with a token
    server = start_server(tmp_path / "run", upstream=one, extra_args=[f"--admin-token-file={tmp_path / 'admin'}"])
    try:
        with Client(server.url, token="the trainer's admin token") as client:
            rid, base = attempt(server, client)
            assert chat(base).status_code == 200
            assert engines_of(client, rid) == [None]  # one engine: as before, none named
            assert [e["url"] for e in client.add_engine(two)] == [one.rstrip("/"), two.rstrip("/")]
            assert [e["url"] for e in client.remove_engine(one)] == [two.rstrip("/")]
            assert chat(base).status_code == 200  # its engine is gone: the attempt moves to the other
            assert engines_of(client, rid)[1] is None  # one engine again
            assert client.info()["engines"] == [two.rstrip("/")]
            with pytest.raises(NotFound, match="no engine"):
                client.remove_engine(one)
            assert httpx.post(f"{server.url}/api/v1/proxy/engines", json={"url": "not a url"}).status_code == 422
    finally:
        server.stop()


def test_the_router_prefers_the_attempts_engine_then_the_least_busy() -> None:
    router = EngineRouter(["http://a/v1", "http://b/v1/"])
    a, b = router.engines["http://a/v1"], router.engines["http://b/v1"]
    a.meter.enter("call 1")
    assert router.pick("attempt 1") is b  # the least busy
    b.meter.enter("call 2")
    b.meter.enter("call 3")
    assert router.pick("attempt 1") is b  # its own engine, though busier now
    assert router.pick("attempt 2") is a
    router.failed(b, "connection refused")
    assert router.pick("attempt 1") is a  # its engine is out of rotation
    router.failed(a, "connection refused")
    assert router.pick("attempt 3") in (a, b)  # all out: still tried, rather than refused
    router.add("http://b/v1")
    assert router.pick("attempt 4") is b
