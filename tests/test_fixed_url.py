"""The run's fixed LLM URL: a client built once, at import time, serves every rollout of a worker, each call
landing in its own rollout with its own agent — async and threaded, with and without a server token."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest

from agl.client import Client
from agl.common.processes import ServerProcess, start_server, start_worker
from agl.testing.fixtures import wait_rollouts

pytestmark = pytest.mark.slow

AGENTS = str(Path(__file__).with_name("fixed_url_agents.py"))


def check_every_call_landed_in_its_own_rollout(client: Client, ids: dict[str, tuple[str, int]]) -> None:
    details = client.rollout_details(list(ids))
    assert len(details) == len(ids)
    for detail in details:
        kind, i = ids[detail.rollout.id]
        calls = [c for c in detail.llm_calls if c.attempt_id == detail.rollout.final_attempt_id]
        texts = sorted(c.request["messages"][0]["content"] for c in calls)  # type: ignore[index,call-overload]
        agents = sorted(str(c.agent_name) for c in calls)
        if kind == "async":
            assert texts == [f"rollout {i} planner", f"rollout {i} solver"]
            assert agents == [f"planner-{i}", f"solver-{i}"]
            by_text = {c.request["messages"][0]["content"]: c.agent_name for c in calls}  # type: ignore[index,call-overload]
            assert by_text[f"rollout {i} planner"] == f"planner-{i}"  # each call under the scope that sent it
        else:
            assert texts == [f"rollout {i} part 0", f"rollout {i} part 1"]
            assert agents == [f"threaded-{i}"] * 2
        assert all(c.trainable and c.prompt_ids and c.attribution.value == "scope" for c in calls)


@pytest.mark.parametrize("token", [None, "s3cret-token"])
def test_an_import_time_client_serves_16_concurrent_rollouts(
    tmp_path: Path, agl_upstream: str, agl_workers: Any, token: str | None
) -> None:
    server = start_server(tmp_path / "run", upstream=agl_upstream, token=token)
    try:
        with Client(server.url, token=token) as client:
            ids: dict[str, tuple[str, int]] = {}
            for i in range(8):
                (r,) = client.enqueue({"i": i, "kind": "async"})
                ids[r.id] = ("async", i)
            extra = [f"--token={token}"] if token else []
            first = agl_workers(
                f"{AGENTS}:async_agent", server.url, concurrency=16, extra_args=["--idle-exit=1", *extra]
            )
            rollouts = wait_rollouts(client, list(ids), timeout=120)
            assert [r.status.value for r in rollouts] == ["succeeded"] * 8, [r.error for r in rollouts]
            first.wait(30)  # the next rollouts are for the threaded agent's worker only

            threaded: dict[str, tuple[str, int]] = {}
            for i in range(8, 16):
                (r,) = client.enqueue({"i": i, "kind": "thread"})
                threaded[r.id] = ("thread", i)
            agl_workers(f"{AGENTS}:thread_agent", server.url, concurrency=16, extra_args=["--idle-exit=3", *extra])
            rollouts = wait_rollouts(client, list(threaded), timeout=120)
            assert [r.status.value for r in rollouts] == ["succeeded"] * 8, [r.error for r in rollouts]
            check_every_call_landed_in_its_own_rollout(client, {**ids, **threaded})
            stored = client.stats()

            # a call at the fixed URL outside any rollout: refused with the reason, never guessed into one
            outside = openai.OpenAI(base_url=f"{server.url}/v1", api_key=token or "sk-x", max_retries=0)
            with pytest.raises(openai.APIStatusError) as info:
                outside.chat.completions.create(model="m", messages=[{"role": "user", "content": "who am I?"}])
            assert info.value.status_code == 409 and "outside any rollout" in info.value.message
            assert client.stats() == stored
    finally:
        server.stop()


UNCHANGED_APP = str(Path(__file__).resolve().parent / "unchanged_app_agents.py") + ":ask"


def test_agl_worker_points_the_openai_sdk_at_the_run(
    agl_server: ServerProcess, agl_workers: Any, agl_upstream: str, tmp_path: Path
) -> None:
    """A client built with no base URL reads OPENAI_BASE_URL: `agl worker` sets it to the run's LLM URL (even over
    a value pointing at the model server behind agl, which would answer and record nothing), and a placeholder key."""
    env = {"OPENAI_BASE_URL": agl_upstream}  # a user's shell pointing the SDK at the model server
    env_without_key = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    with Client(agl_server.url) as client:
        ids = [r.id for r in client.enqueue({"q": "hello"}, n=2)]
        proc = start_worker_without_key(UNCHANGED_APP, agl_server.url, env_without_key, env, tmp_path)
        try:
            rollouts = wait_rollouts(client, ids)
        finally:
            proc.terminate()
            proc.wait(10)
        assert [r.status.value for r in rollouts] == ["succeeded", "succeeded"]
        calls = [c for r in rollouts for c in client.rollout_detail(r.id).llm_calls]
        assert len(calls) == 2 and all(c.agent_name == "asker" and c.trainable for c in calls)
    log = (tmp_path / "worker.log").read_text()
    assert "OPENAI_BASE_URL was" in log and "--keep-openai-env" in log


def test_keep_openai_env_leaves_the_sdk_where_the_user_pointed_it(
    agl_server: ServerProcess, agl_upstream: str, tmp_path: Path
) -> None:
    env = {"OPENAI_BASE_URL": agl_upstream, "OPENAI_API_KEY": "k"}
    with Client(agl_server.url) as client:
        (rollout,) = client.enqueue({"q": "hello"})
        proc = start_worker(
            UNCHANGED_APP, agl_server.url, extra_args=["--keep-openai-env"], env=env, log_path=tmp_path / "w.log"
        )
        try:
            (done,) = wait_rollouts(client, [rollout.id])
        finally:
            proc.terminate()
            proc.wait(10)
        assert done.status.value == "succeeded"  # answered by the model server directly ...
        assert client.rollout_detail(done.id).llm_calls == []  # ... and recorded nowhere


def start_worker_without_key(
    agent: str, server_url: str, base_env: dict[str, str], env: dict[str, str], tmp_path: Path
) -> subprocess.Popen[bytes]:
    log = (tmp_path / "worker.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "agl.cli.main", "worker", agent, f"--server={server_url}", "--log-level=warning"],
        stdout=log,
        stderr=log,
        env={**base_env, **env},
    )
