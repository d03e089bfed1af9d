"""Least privilege for what an agent runs, on a real `agl serve --token` (and a real `agl worker` where it matters):
the agent's key opens its attempt's LLM routes and nothing else; an attempt's first report stands (a disagreeing
one is refused with 409); rewards outside the server's range are refused; a reward emitted after a separate
process's LLM calls is placed after them and kept by training; `agl export` counts the rewards it drops; the
operator token stays out of reach of the agent's processes (not dumpable, `--token-file`)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

import agl
from agl.cli.main import cli
from agl.client import API, Client
from agl.common.processes import ServerProcess, start_server, stop_processes
from agl.learn.transitions import build_episodes
from agl.testing.fixtures import wait_rollouts

TOKEN = "operator-token-least-privilege"
ADMIN = {"authorization": f"Bearer {TOKEN}"}
APP = f"{__file__}:least_privilege_app"

# The harness: another process (no agl in it) that asks the model twice through the attempt's URL with the key it
# was given, then tries the attempt's reports with that key; it prints what it saw.
HARNESS = """
import os, httpx
base, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
auth = {"authorization": "Bearer " + key}
print("llm key:", key.split(".")[0], "| operator token in env:", "AGL_TOKEN" in os.environ, flush=True)
for n in range(2):
    body = {"model": "m", "messages": [{"role": "user", "content": "q%d" % n}]}
    print("call", httpx.post(base + "/chat/completions", json=body, headers=auth, timeout=30).status_code, flush=True)
root, rest = base.split("/rollout/", 1)
rollout, _, attempt = rest.split("/")[:3]
hacked = [{"rollout_id": rollout, "attempt_id": attempt, "value": 1.0, "name": "hacked"}]
print("own reward", httpx.post(root + "/api/v1/rewards", json=hacked, headers=auth).status_code, flush=True)
done = {"status": "succeeded", "reward": 1.0}
print("own completion", httpx.post(root + f"/api/v1/attempts/{attempt}/complete", json=done, headers=auth).status_code)
"""


@agl.rollout
def least_privilege_app(task: str, llm: agl.LLM) -> float:
    """Run by a real `agl worker` (this file is its app): `dumpable` reports the worker process's flag as its
    reward; `harness` emits a reward before any call, runs HARNESS through agl.run_cli, emits one after it."""
    if task == "dumpable":
        from agl.cli.secrets import is_dumpable

        return 1.0 if is_dumpable() else -1.0
    agl.emit_reward(0.125, name="before any call")
    done = agl.run_cli([sys.executable, "-c", HARNESS], llm=llm, agent="harness", sandbox="none", timeout_s=60)
    expected = ("llm key: agl-llm | operator token in env: False", "call 200", "own reward 403", "own completion 403")
    if done.returncode != 0 or not all(line in done.output_tail for line in expected):
        raise RuntimeError(f"the harness saw otherwise: {done.output_tail}")
    agl.emit_reward(0.5, name="after the harness")
    return 1.0


@pytest.fixture(scope="module")
def server(agl_upstream: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = start_server(tmp_path_factory.mktemp("least-privilege") / "run", upstream=agl_upstream, token=TOKEN)
    yield srv
    srv.stop()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.url, token=TOKEN) as c:
        yield c


def claim(server: ServerProcess, client: Client, **options: Any) -> dict[str, Any]:
    """Enqueue a rollout and claim it as a worker would: the claim as JSON (with its credentials)."""
    client.enqueue("q", **options)
    (found,) = httpx.post(f"{server.url}{API}/claims", json={"worker_id": "w"}, headers=ADMIN).json()
    return dict(found)


def chat(url: str, key: str, **headers: str) -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(url, json=body, headers={"authorization": f"Bearer {key}", **headers})


def error(resp: httpx.Response) -> str:
    return str(resp.json()["error"]["message"])


def test_the_llm_credential_opens_its_attempts_llm_routes_and_nothing_else(
    server: ServerProcess, client: Client
) -> None:
    mine, other = claim(server, client), claim(server, client)
    key = mine["llm_credential"]
    assert key.startswith("agl-llm.") and key not in (mine["credential"], other["llm_credential"])
    rollout, attempt = mine["rollout"]["id"], mine["attempt"]["id"]
    own = f"{server.url}/rollout/{rollout}/attempt/{attempt}"
    assert chat(f"{own}/v1/chat/completions", key).status_code == 200
    assert chat(f"{own}/agent/harness/v1/chat/completions", key).status_code == 200  # the URL naming its agent
    fixed = {"x-agl-rollout-id": rollout, "x-agl-attempt-id": attempt}
    assert chat(f"{server.url}/v1/chat/completions", key, **fixed).status_code == 200  # the run's fixed URL
    assert httpx.get(f"{own}/v1/models", headers={"authorization": f"Bearer {key}"}).status_code == 200
    theirs = f"{server.url}/rollout/{other['rollout']['id']}/attempt/{other['attempt']['id']}/v1/chat/completions"
    assert chat(theirs, key).status_code == 403
    now = time.time()
    span = {"trace_id": "1" * 32, "span_id": "2" * 16, "name": "s", "start_time": now, "end_time": now}
    span |= {"rollout_id": rollout, "attempt_id": attempt}
    otlp_attrs = [
        {"key": "agl.rollout_id", "value": {"stringValue": rollout}},
        {"key": "agl.attempt_id", "value": {"stringValue": attempt}},
    ]
    otlp_span = {"traceId": "3" * 32, "spanId": "4" * 16, "name": "s", "attributes": otlp_attrs}
    otlp_span |= {"startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000000000001000"}
    refused = [
        ("POST", f"{API}/rewards", [{"rollout_id": rollout, "attempt_id": attempt, "value": 1.0}]),
        ("POST", f"{API}/spans", {"spans": [span]}),
        ("POST", "/v1/traces", {"resourceSpans": [{"scopeSpans": [{"spans": [otlp_span]}]}]}),
        ("POST", f"{API}/attempts/{attempt}/heartbeat", {"lease_s": 30}),
        ("POST", f"{API}/attempts/{attempt}/complete", {"status": "succeeded", "reward": 1.0}),
        ("GET", f"{API}/proxy/engines", None),
        ("POST", f"{API}/proxy/engines", {"url": "http://127.0.0.1:9/v1"}),
        ("POST", f"{API}/proxy/hold", {}),
        ("GET", f"{API}/rollouts/{rollout}/detail", None),
        ("POST", f"{API}/claims", {"worker_id": "w"}),
        ("GET", f"{API}/info", None),
    ]
    for method, path, body in refused:
        resp = httpx.request(method, server.url + path, json=body, headers={"authorization": f"Bearer {key}"})
        assert resp.status_code == 403, (path, resp.text)
        assert "LLM-only credential" in error(resp) and "nothing else" in error(resp), path
    detail = client.rollout_detail(rollout)
    assert detail.rewards == [] and detail.rollout.status.value == "running" and not detail.spans
    for c in (mine, other):
        client.cancel(c["rollout"]["id"])
    # a MAC of one kind does not open the other: each domain is its own
    mac_of_llm, mac_of_attempt = key.rsplit(".", 1)[1], mine["credential"].rsplit(".", 1)[1]
    assert chat(f"{own}/v1/chat/completions", f"agl-llm.{attempt}.{mac_of_attempt}").status_code == 401
    auth = {"authorization": f"Bearer agl-attempt.{attempt}.{mac_of_llm}"}
    reward = [{"rollout_id": rollout, "attempt_id": attempt, "value": 1.0}]
    assert httpx.post(f"{server.url}{API}/rewards", json=reward, headers=auth).status_code == 401


def test_a_second_completion_that_disagrees_is_refused_and_the_first_stands(
    server: ServerProcess, client: Client
) -> None:
    found = claim(server, client)
    complete = f"{server.url}{API}/attempts/{found['attempt']['id']}/complete"
    first = {"status": "succeeded", "reward": 0.25}
    assert httpx.post(complete, json=first, headers=ADMIN).status_code == 200
    assert httpx.post(complete, json=first, headers=ADMIN).status_code == 200  # the same report again: idempotent
    for disagreeing in ({"status": "succeeded", "reward": 0.0}, {"status": "succeeded"}, {"status": "failed"}):
        resp = httpx.post(complete, json=disagreeing, headers=ADMIN)
        assert resp.status_code == 409 and "first report stands" in error(resp), resp.text
    detail = client.rollout_detail(found["rollout"]["id"])
    assert detail.rollout.final_reward == 0.25 and [r.value for r in detail.rewards] == [0.25]
    # an attempt that reported its failure, its rollout queued again: a later success of the same attempt is refused
    failed = claim(server, client)
    complete = f"{server.url}{API}/attempts/{failed['attempt']['id']}/complete"
    assert httpx.post(complete, json={"status": "failed", "error": "boom"}, headers=ADMIN).status_code == 200
    assert httpx.post(complete, json={"status": "succeeded", "reward": 1.0}, headers=ADMIN).status_code == 409
    rollout = client.get_rollout(failed["rollout"]["id"])
    assert rollout.status.value == "queued" and rollout.final_reward is None
    client.cancel(rollout.id)


def test_rewards_outside_the_range_are_refused_and_nothing_is_stored(server: ServerProcess, client: Client) -> None:
    assert client.info()["max_abs_reward"] == 1000.0
    found = claim(server, client)
    rollout, attempt = found["rollout"]["id"], found["attempt"]["id"]
    ok = {"rollout_id": rollout, "attempt_id": attempt, "value": 0.5}
    resp = httpx.post(f"{server.url}{API}/rewards", json=[ok, {**ok, "value": 1e9}], headers=ADMIN)
    assert resp.status_code == 400
    assert "1000000000.0" in error(resp) and "[-1000, 1000]" in error(resp) and "--max-abs-reward" in error(resp)
    non_finite = f'[{{"rollout_id": "{rollout}", "attempt_id": "{attempt}", "value": NaN}}]'
    resp = httpx.post(
        f"{server.url}{API}/rewards", content=non_finite, headers={**ADMIN, "content-type": "application/json"}
    )
    assert resp.status_code == 422 and "finite" in error(resp)  # refused as the request is validated
    complete = f"{server.url}{API}/attempts/{attempt}/complete"
    resp = httpx.post(complete, json={"status": "succeeded", "reward": -1e9}, headers=ADMIN)
    assert resp.status_code == 400 and "-1000000000.0" in error(resp)
    assert client.rollout_detail(rollout).rewards == [] and client.get_rollout(rollout).status.value == "running"
    assert httpx.post(f"{server.url}{API}/rewards", json=[{**ok, "value": -1000.0}], headers=ADMIN).status_code == 200
    assert httpx.post(complete, json={"status": "succeeded", "reward": 1000.0}, headers=ADMIN).status_code == 200


def test_the_runner_reports_a_refused_reward_and_a_discarded_result_loudly(
    server: ServerProcess, client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    @agl.rollout
    def returns_too_much(task: str, llm: agl.LLM) -> float:
        if task == "completes itself":  # another report comes first (as the attempt credential could once)
            ctx = agl.current_rollout()
            assert ctx is not None
            with Client(server.url, token=TOKEN) as own:
                own._call("POST", f"/attempts/{ctx.attempt_id}/complete", {"status": "succeeded", "reward": 1.0})
            return 0.0
        return 1e9

    (too_much,) = client.enqueue("too much", max_attempts=1)
    (itself,) = client.enqueue("completes itself", max_attempts=1)
    with caplog.at_level(logging.WARNING, logger="agl.capture.runner"):
        stats = agl.Runner(returns_too_much, server.url, token=TOKEN, concurrency=1).run(max_rollouts=2)
    refused = client.get_rollout(too_much.id)
    assert refused.status.value == "failed" and "refused the agent's reward" in (refused.error or "")
    assert "[-1000, 1000]" in (refused.error or "")
    assert stats.discarded == 1 and stats.failed == 1
    assert client.get_rollout(itself.id).final_reward == 1.0  # the first report stands
    assert any(
        "discarded by the server" in r.getMessage() and "first report stands" in r.getMessage() for r in caplog.records
    )


def test_a_reward_after_a_separate_process_s_calls_lands_after_them_and_export_counts_drops(
    server: ServerProcess, client: Client, agl_workers: Any, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    harness, dumpable = client.enqueue("harness")[0], client.enqueue("dumpable")[0]
    # the token from a file; AGL_TOKEN in the worker's environment too, which no program it runs may inherit
    worker = agl_workers(APP, server.url, extra_args=[f"--token-file={token_file}"], env={"AGL_TOKEN": TOKEN})
    done = wait_rollouts(client, [harness.id, dumpable.id])
    assert [r.status.value for r in done] == ["succeeded", "succeeded"], [r.error for r in done]
    # the worker process is not dumpable (prctl(PR_GET_DUMPABLE) said 0 inside it): its environment is out of reach
    assert done[1].final_reward == -1.0 and (AS_ROOT or read_environ(worker.pid) == "13")
    detail = client.rollout_detail(harness.id)
    seqs = sorted(c.seq for c in detail.llm_calls)
    assert seqs == [0, 1] and all(c.agent_name == "harness" for c in detail.llm_calls)
    placed = {r.name: r.after_llm_seq for r in detail.rewards}
    assert placed == {"before any call": None, "after the harness": 1, "final": 1}  # "hacked" never stored
    episodes, stats = build_episodes(client.trainable_rollouts([harness.id]))
    assert [t.reward for t in episodes[0].transitions] == [0.0, 1.5]
    assert dict(stats.dropped_rewards) == {"before the first transition": 1}
    out = tmp_path / "transitions.jsonl"
    export = ["export", f"--server={server.url}", f"--token-file={token_file}", "--agents=harness", f"--output={out}"]
    exported = subprocess.run(
        [sys.executable, "-m", "agl.cli.main", *export],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "AGL_TOKEN"},
    )
    assert exported.returncode == 0, exported.stderr
    assert "1 reward(s) dropped: before the first transition 1" in " ".join(exported.stderr.split())
    rows = [json.loads(line) for line in out.read_text().splitlines() if json.loads(line)["rollout_id"] == harness.id]
    assert [r["reward"] for r in rows] == [0.0, 1.5]


READER = "import sys\ntry:\n    open(sys.argv[1], 'rb').read(); print('read')\nexcept OSError as e: print(e.errno)"
# root reads every process's /proc/<pid>/environ, dumpable or not (even without CAP_SYS_PTRACE, measured here):
# as root only the flag itself can be checked, as another user the read is refused (EACCES)
AS_ROOT = os.geteuid() == 0


def read_environ(pid: int) -> str:
    """'read', or the errno, when a process of this user tries to read `/proc/<pid>/environ`."""
    done = subprocess.run([sys.executable, "-c", READER, f"/proc/{pid}/environ"], capture_output=True, text=True)
    return done.stdout.strip() or done.stderr


SERVE_FLAG = """
import agl.server.app
from click.testing import CliRunner
from agl.cli.main import cli
from agl.cli.secrets import is_dumpable
agl.server.app.serve = lambda *args, **kwargs: print("dumpable when serving:", is_dumpable())
print(CliRunner().invoke(cli, ["serve", "--run-dir", "unused"]).output)
"""


def test_agl_serve_is_not_dumpable_so_its_environment_is_out_of_reach(server: ServerProcess) -> None:
    """`agl serve` marks itself not dumpable before it serves (checked as `prctl(PR_GET_DUMPABLE)` answers in the
    command's own process; /proc/<pid>/status does not show the flag); as a user other than root, another process
    of that user cannot read the server's environment while it can read any other process's."""
    flag = subprocess.run([sys.executable, "-c", SERVE_FLAG], capture_output=True, text=True, timeout=60)
    assert "dumpable when serving: False" in flag.stdout, flag.stdout + flag.stderr
    if AS_ROOT:
        return
    assert server.proc is not None
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        seen = {"server": read_environ(server.proc.pid), "another process of the user": read_environ(sleeper.pid)}
    finally:
        stop_processes([sleeper], grace_s=5)
    assert seen == {"server": "13", "another process of the user": "read"}  # EACCES for the server alone


def test_token_file_is_read_and_given_once(tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("\n")
    for args, words in (
        ([f"--token-file={tmp_path / 'missing'}"], "cannot read"),
        ([f"--token-file={tmp_path / 'empty'}"], "holds no token"),
        ([f"--token-file={tmp_path / 'empty'}", "--token=t"], "not both"),
    ):
        done = CliRunner().invoke(cli, ["rollouts", "--server=http://127.0.0.1:9", *args])
        assert done.exit_code == 2 and words in done.output, done.output
