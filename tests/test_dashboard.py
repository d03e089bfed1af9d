"""The dashboard at /ui through a real `agl serve --run-dir` on a finished run: pages, filters, keyset paging,
the rollout page (calls, tool status, AIR reward, traceback, transitions), the curve's API, and the token."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agl.common.processes import ServerProcess, start_server
from tests.dashboard_runs import write_run

TOKEN = "dash-s3cret"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, dict[str, list[str]]]]:
    run_dir = tmp_path_factory.mktemp("dash") / "run"
    ids = write_run(run_dir, extra_queued=110)
    server = start_server(run_dir)
    yield server, ids
    server.stop()


def ids_on(html: str) -> list[str]:
    return re.findall(r"href='/ui/rollouts/(ro-[0-9a-f]+)'", html)


def get(server: ServerProcess, path: str) -> httpx.Response:
    response = httpx.get(server.url + path)
    assert response.status_code == 200, response.text[:300]
    return response


def test_the_overview_counts_the_run_and_embeds_the_curve(run: tuple[ServerProcess, dict[str, list[str]]]) -> None:
    server, _ = run
    page = get(server, "/ui").text
    assert re.search(r'data-count="succeeded">\s*9<', page)  # 8 train + 1 eval
    assert re.search(r'data-count="failed">\s*1<', page) and re.search(r'data-count="queued">\s*110<', page)
    curve = get(server, "/ui/api/curve").json()
    assert [p[0] for p in curve["train_reward"]] == [0, 1] and [p[0] for p in curve["eval_accuracy"]] == [0, 2]
    assert 'data-points="6"' in page  # 2 train rewards + 2 success rates + 2 accuracies
    counts = get(server, "/ui/api/overview").json()
    assert counts["rollouts"] == 120 and counts["llm_calls"] == 8
    # the workers by node (a worker id's part before its pid and suffix; these are ids without one), their attempts
    nodes = counts["workers_by_node"]
    assert "<h2>Workers by node</h2>" in page and {n["node"] for n in nodes} >= {"w1"}
    assert all(n["claimed"] == n["running"] + n["finished"] + n["failed"] for n in nodes)
    assert sum(n["finished"] for n in nodes) == 9


def test_the_overview_lists_the_training_steps_with_staleness_and_importance_weights(
    run: tuple[ServerProcess, dict[str, list[str]]],
) -> None:
    server, _ = run
    table = get(server, "/ui").text.split("<table id=steps>", 1)[1].split("</table>", 1)[0]
    rows = re.findall(r"<tr>(.*?)</tr>", table.split("<tbody>", 1)[1])
    cells = [re.findall(r"<td>(.*?)</td>", row) for row in rows]
    assert [c[0] for c in cells] == ["0", "1"]
    assert cells[1] == ["1", "0.600", "4", "0:3 1:1", "0.998", "1.31", "91%", "62%", "118", "4.5"]
    assert cells[0][3:] == [""] * 7  # a step that reported none of it: empty cells, not zeros


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("status=failed", "failed"),
        ("mode=eval", "eval"),
        ("agent=writer", "writer"),
        ("status=succeeded&mode=train&min_reward=0.5", "writer"),  # the rewarded ones are the writer's
    ],
)
def test_filters_change_the_rows(run: tuple[ServerProcess, dict[str, list[str]]], query: str, expected: str) -> None:
    server, ids = run
    page = get(server, f"/ui/rollouts?{query}").text
    assert sorted(ids_on(page)) == sorted(ids[expected])
    assert f"<span id=total>{len(ids[expected])}</span>" in page


def test_step_and_reward_bounds(run: tuple[ServerProcess, dict[str, list[str]]]) -> None:
    server, _ = run
    assert get(server, "/ui/api/rollouts?step=1").json()["total"] == 4
    assert get(server, "/ui/api/rollouts?max_reward=0").json()["total"] == 4  # the checker's rollouts


def test_keyset_pages_cover_every_rollout_once_newest_first(run: tuple[ServerProcess, dict[str, list[str]]]) -> None:
    server, ids = run
    seen: list[str] = []
    path: str | None = "/ui/rollouts"
    pages = 0
    while path is not None:
        html = get(server, path).text
        seen += ids_on(html)
        found = re.search(r"<a rel=next href='([^']+)'", html)
        path = found[1].replace("&amp;", "&") if found else None
        pages += 1
    everything = [i for group in ("succeeded", "failed", "eval", "queued") for i in ids[group]]
    assert pages == 3 and len(seen) == len(set(seen)) == len(everything) == 120
    assert set(seen) == set(everything)
    assert seen[:110] == list(reversed(ids["queued"]))  # the last enqueued come first
    api = get(server, "/ui/api/rollouts?size=7").json()
    assert len(api["rows"]) == 7 and api["next"] and api["total"] == 120
    nxt = get(server, f"/ui/api/rollouts?size=7&after={api['next']}").json()
    assert not {r["id"] for r in api["rows"]} & {r["id"] for r in nxt["rows"]}


def test_bad_filter_values_are_a_clear_400(run: tuple[ServerProcess, dict[str, list[str]]]) -> None:
    server, _ = run
    for query, word in (("step=two", "step"), ("min_reward=lots", "min_reward"), ("after=nonsense", "cursor")):
        response = httpx.get(f"{server.url}/ui/rollouts?{query}")
        assert response.status_code == 400 and word in response.json()["error"]["message"]


def test_a_rollout_page_shows_calls_tools_rewards_and_transitions(
    run: tuple[ServerProcess, dict[str, list[str]]],
) -> None:
    server, ids = run
    checker = next(i for i in ids["succeeded"] if i not in ids["writer"])
    page = get(server, f"/ui/rollouts/{checker}").text
    assert "LLM #0</b> agent checker" in page and "question for checker" in page and "4 → 2 tokens" in page
    assert "tool <b>calculator</b></span> <span class=bad>error</span>" in page
    assert "ZeroDivisionError: division by zero" in page
    assert "air:tool_status = -0.1" in page and "automatic, after LLM #0" in page
    transitions = re.search(r"<table id=transitions>.*?</table>", page, re.S)
    assert transitions and "checker" in transitions[0] and "-0.5" in transitions[0]
    failed = get(server, f"/ui/rollouts/{ids['failed'][0]}").text
    assert "Traceback (most recent call last)" in failed and "the agent could not parse the answer" in failed
    assert httpx.get(f"{server.url}/ui/rollouts/ro-0000000000000000").status_code == 404


def test_agent_text_is_escaped(tmp_path: Path) -> None:
    from agl.schema import EnqueueRequest, TaskIn
    from agl.store import Store

    with Store(tmp_path) as store:
        store.enqueue(EnqueueRequest(task=TaskIn(input={"q": "<script>alert(1)</script>"}), n=1)).result()
        rollout_id = store.list_rollouts()[0][0].id
    server = start_server(tmp_path)
    try:
        page = get(server, f"/ui/rollouts/{rollout_id}").text
    finally:
        server.stop()
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)" in page


def test_with_a_token_the_ui_and_its_api_need_it_and_a_browser_gets_a_cookie(tmp_path: Path) -> None:
    write_run(tmp_path / "run", steps=1, per_step=2)
    server = start_server(tmp_path / "run", token=TOKEN)
    try:
        for path in ("/ui", "/ui/rollouts", "/ui/api/overview", "/ui/api/curve", "/ui/static/app.js"):
            response = httpx.get(server.url + path)
            assert response.status_code == 401 and "/ui?token=" in response.json()["error"]["message"]
        assert httpx.get(f"{server.url}/ui?token=wrong").status_code == 401
        with httpx.Client(base_url=server.url) as browser:
            first = browser.get("/ui/rollouts?token=" + TOKEN + "&mode=train", follow_redirects=False)
            assert first.status_code == 303 and first.headers["location"] == "/ui/rollouts?mode=train"
            cookie = first.headers["set-cookie"]
            assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/ui" in cookie
            assert TOKEN not in cookie  # derived from the token, not the token
            assert browser.get("/ui/rollouts?mode=train").status_code == 200
            assert browser.get("/ui/api/overview").status_code == 200
            assert browser.get("/api/v1/rollouts").status_code == 401  # the cookie opens the dashboard only
        bearer = httpx.get(server.url + "/ui", headers={"authorization": f"Bearer {TOKEN}"})
        assert bearer.status_code == 200
    finally:
        server.stop()
