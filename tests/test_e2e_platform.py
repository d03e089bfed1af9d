"""End to end: a real `agl serve` process, real worker processes, an agent using the OpenAI SDK through the
proxy against a scripted upstream that returns token ids; what is stored is checked field by field."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from agl.client import Client
from agl.common.processes import ServerProcess
from agl.testing.upstream import encode, render_prompt
from tests.conftest import run_cli, wait_all, wait_until

pytestmark = pytest.mark.slow

QUESTIONS = [("What is 12+30?", 42), ("What is 7+8?", 15), ("What is 100+1?", 101), ("What is 5+5?", 10)]


def enqueue_questions(client: Client, n: int = 2) -> list[str]:
    ids = []
    for question, answer in QUESTIONS:
        ids += [r.id for r in client.enqueue({"question": question, "answer": answer}, n=n)]
    return ids


def test_rollouts_through_proxy_store_exact_calls_agents_and_rewards(
    server: ServerProcess, client: Client, workers: Any
) -> None:
    ids = enqueue_questions(client)
    workers("calc_agent", server.url, concurrency=3, extra_args=["--idle-exit=3"])
    workers("calc_agent", server.url, concurrency=3, extra_args=["--idle-exit=3"])
    rollouts = wait_all(client, ids)
    assert [r.status.value for r in rollouts] == ["succeeded"] * len(ids)
    assert all(r.final_reward == 1.0 for r in rollouts)

    for rollout in rollouts:
        detail = client.rollout_detail(rollout.id)
        calls = [c for c in detail.llm_calls if c.attempt_id == rollout.final_attempt_id]
        assert [c.seq for c in calls] == [0, 1]
        planner, answerer = calls
        assert (planner.agent_name, answerer.agent_name) == ("planner", "answerer")
        assert planner.attribution.value == answerer.attribution.value == "scope"
        assert (planner.stream, answerer.stream) == (False, True)
        # exact ids: the prompt ids are the upstream's encoding of the messages it was sent
        assert planner.prompt_ids == encode(render_prompt(planner.request["messages"], planner.request.get("tools")))
        assert answerer.prompt_ids == encode(render_prompt(answerer.request["messages"], answerer.request.get("tools")))
        assert planner.response_message["tool_calls"][0]["function"]["name"] == "calculator"
        assert planner.finish_reason == "tool_calls"
        answer_text = answerer.response_message["content"]
        assert answerer.response_ids == encode(answer_text)
        assert len(answerer.logprobs or []) == len(answerer.response_ids)
        assert all(c.trainable for c in calls)
        # rewards: the intermediate one sits after the planner's call, the returned one after the answer
        rewards = {(r.name, r.source.value, r.after_llm_seq, r.value) for r in detail.rewards}
        assert rewards == {("tool_ok", "explicit", 0, 0.1), ("final", "returned", 1, 1.0)}
        tool_spans = [s for s in detail.spans if s.name == "tool:calculator"]
        assert len(tool_spans) == 1 and tool_spans[0].status.value == "ok"
        agent_spans = {
            s.attributes.get("agl.agent.name") for s in detail.spans if s.attributes.get("agl.span.kind") == "agent"
        }
        assert agent_spans == {"planner", "answerer"}
        # the LLM call hangs under its agent's span
        span_of = {s.span_id: s for s in detail.spans}
        assert span_of[planner.parent_span_id].name == "agent:planner"

    # the training read over HTTP (packed ids in base64) holds exactly the final attempts' calls and rewards
    for got in client.trainable_rollouts(ids):
        detail = client.rollout_detail(got.rollout.id)
        final = [c for c in detail.llm_calls if c.attempt_id == got.rollout.final_attempt_id]
        assert [(c.id, list(c.prompt_ids or []), list(c.response_ids or [])) for c in got.llm_calls] == [
            (c.id, c.prompt_ids, c.response_ids) for c in final
        ]
        assert [list(c.logprobs or []) for c in got.llm_calls] == [c.logprobs for c in final]
        assert [c.response_message for c in got.llm_calls] == [c.response_message for c in final]
        assert got.rewards == [r for r in detail.rewards if r.attempt_id == got.rollout.final_attempt_id]

    shown = run_cli("show", ids[0], f"--server={server.url}").stdout
    for expected in ("planner", "answerer", "calculator", "tool_ok", "succeeded"):
        assert expected in shown
    listed = run_cli("rollouts", f"--server={server.url}").stdout
    assert ids[0] in listed

    out = server.run_dir / "calls.jsonl"
    run_cli("export", f"--server={server.url}", f"--output={out}")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 * len(ids)
    assert {row["agent_name"] for row in rows} == {"planner", "answerer"}
    assert all(row["prompt_ids"] and row["response_ids"] for row in rows)

    # what a selection keeps, by the code agl train uses: the planner's calls only, and the summary says so
    kept = server.run_dir / "planner.jsonl"
    shown = run_cli("export", f"--server={server.url}", f"--output={kept}", "--agents=plan*").stderr
    transitions = [json.loads(line) for line in kept.read_text().splitlines()]
    assert len(transitions) == len(ids) and {t["agent_name"] for t in transitions} == {"planner"}
    by_call = {row["id"]: row for row in rows}
    for t in transitions:
        (call_id,) = t["call_ids"]
        assert t["prompt_ids"] == by_call[call_id]["prompt_ids"] and t["reward"] == pytest.approx(0.1 + 1.0)
    cells = {row[0]: row[1:] for line in shown.splitlines() if (row := [c for c in line.split() if c != "│"])}
    assert cells["planner"] == ["yes", str(len(ids)), "0"]
    assert cells["answerer"] == ["no", "0", str(len(ids))]
    assert "agent not selected" in shown
    nothing = run_cli("export", f"--server={server.url}", "--agents=writer").stderr
    assert "the selection kept no call" in nothing and "answerer, planner" in nothing


def test_worker_killed_mid_rollout_is_retried_and_recorded_once(
    server: ServerProcess, client: Client, workers: Any, tmp_path: Path
) -> None:
    marker_dir = tmp_path / "markers"
    marker_dir.mkdir()
    env = {"AGL_TEST_MARKER_DIR": str(marker_dir)}
    (rollout,) = client.enqueue({"sleep_s": 60}, max_attempts=3)
    victim = workers("slow_agent", server.url, concurrency=1, env=env, extra_args=["--lease=2", "--heartbeat=0.5"])
    wait_until(lambda: (marker_dir / rollout.id).exists(), 60, "the first attempt to start sleeping")
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    workers("slow_agent", server.url, concurrency=1, env=env, extra_args=["--lease=2", "--heartbeat=0.5"])
    (done,) = wait_all(client, [rollout.id], timeout=60)
    assert done.status.value == "succeeded"
    detail = client.rollout_detail(rollout.id)
    assert [a.status.value for a in detail.attempts] == ["lost", "succeeded"]
    assert done.final_attempt_id == detail.attempts[1].id
    final_rewards = [r for r in detail.rewards if r.source.value == "returned"]
    assert len(final_rewards) == 1 and final_rewards[0].attempt_id == done.final_attempt_id
    assert [r.name for r in detail.rewards if r.name == "woke"] == ["woke"]
    exported = [json.loads(line) for line in client.export_llm_calls()]
    assert [row["attempt_id"] for row in exported if row["rollout_id"] == rollout.id] == [done.final_attempt_id]


def test_server_killed_and_restarted_loses_no_finished_work(server: ServerProcess, workers: Any) -> None:
    with Client(server.url) as client:
        ids = enqueue_questions(client, n=6)
        workers("calc_agent", server.url, concurrency=2)
        wait_until(lambda: client.stats()["rollouts_by_status"].get("succeeded", 0) >= 6, 60, "some rollouts to finish")
    server.kill()
    # What had been acknowledged before the crash, read straight from the database file.
    from agl.store import Store

    with Store(server.run_dir) as snapshot:
        finished = {
            r.id: (r.final_attempt_id, len(snapshot.spans(r.id)), len(snapshot.llm_calls(r.id)))
            for r in snapshot.get_rollouts(ids)
            if r.status.value == "succeeded"
        }
    assert finished
    server.start()
    with Client(server.url) as client:
        rollouts = wait_all(client, ids, timeout=120)
        assert all(r.status.value == "succeeded" for r in rollouts)
        for rid, (attempt_id, n_spans, n_calls) in finished.items():
            detail = client.rollout_detail(rid)
            assert detail.rollout.final_attempt_id == attempt_id
            assert len(detail.spans) >= n_spans and len(detail.llm_calls) >= n_calls
            assert n_spans >= 3 and n_calls >= 2  # two agent spans and a tool span; two calls


def test_failing_agent_is_retried_then_failed_with_its_error(
    server: ServerProcess, client: Client, workers: Any
) -> None:
    (rollout,) = client.enqueue({"question": "q7"}, max_attempts=2)
    workers("failing_agent", server.url, concurrency=1, extra_args=["--idle-exit=3"])
    (done,) = wait_all(client, [rollout.id])
    assert done.status.value == "failed"
    assert "RuntimeError: boom on q7" in (done.error or "") and "attempt 2 of 2" in (done.error or "")
    # each attempt keeps where the agent failed, and agl show prints it under the attempt
    attempts = client.rollout_detail(rollout.id).attempts
    assert all("e2e_agents.py" in (a.error or "") and "in failing_agent" in (a.error or "") for a in attempts)
    shown = run_cli("show", rollout.id, f"--server={server.url}").stdout
    assert "Traceback (most recent call last)" in shown and 'raise RuntimeError(f"boom on' in shown


def test_bulk_details_and_the_rollout_mode_reaches_the_backend(server: ServerProcess, client: Client) -> None:
    import httpx

    train = client.enqueue("t1")[0]
    ev = client.enqueue("t2", mode="eval")[0]
    claims = httpx.post(f"{server.url}/api/v1/claims", json={"worker_id": "w", "max_rollouts": 2}).json()
    modes = {}
    for claim in claims:
        base = f"{server.url}/rollout/{claim['rollout']['id']}/attempt/{claim['attempt']['id']}/v1"
        answer = httpx.post(f"{base}/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}).json()
        modes[claim["rollout"]["id"]] = answer["system_fingerprint"]
    assert modes == {train.id: "scripted;mode=train", ev.id: "scripted;mode=eval"}
    details = client.rollout_details([ev.id, train.id, "ro-unknown"])
    assert [d.rollout.id for d in details] == [ev.id, train.id]
    assert [len(d.llm_calls) for d in details] == [1, 1]
    assert details[0].model_dump() == client.rollout_detail(ev.id).model_dump()


def test_eval_temperature_overrides_what_the_agent_asks_for_in_eval_rollouts_only(
    tmp_path: Path, upstream: str
) -> None:
    import httpx

    from agl.common.processes import start_server

    server = start_server(tmp_path / "run", upstream=upstream, extra_args=["--eval-temperature=0"])
    try:
        with Client(server.url) as client:
            train = client.enqueue("t1")[0]
            ev = client.enqueue("t2", mode="eval")[0]
            claims = httpx.post(f"{server.url}/api/v1/claims", json={"worker_id": "w", "max_rollouts": 2}).json()
            said = {}
            for claim in claims:
                base = f"{server.url}/rollout/{claim['rollout']['id']}/attempt/{claim['attempt']['id']}/v1"
                body = {
                    "messages": [
                        {"role": "system", "content": "agl-say: t={temperature}"},
                        {"role": "user", "content": "hi"},
                    ],
                    "temperature": 0.9,
                }
                said[claim["rollout"]["id"]] = httpx.post(f"{base}/chat/completions", json=body).json()
            answers = {rid: a["choices"][0]["message"]["content"] for rid, a in said.items()}
            assert answers == {train.id: "t=0.9", ev.id: "t=0.0"}
            # the stored request is what the agent sent; the override is the server's, applied on the way out
            assert client.rollout_detail(ev.id).llm_calls[0].request["temperature"] == 0.9
    finally:
        server.stop()
