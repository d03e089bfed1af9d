"""`agl export --agents`: the summary lists every agent name stored, those of rollouts it left out included (a
rollout that returned no reward was left out before its calls were read, and the summary said "agent names
stored: weather" while `weather_stream`'s calls were stored), and names the rollouts it left out, with why. A real
`agl serve`, rollouts driven over HTTP, `agl export` as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import openai

from agl.client import Client
from agl.common.attributes import HEADER_AGENT
from agl.common.processes import ServerProcess


def one_rollout(server: ServerProcess, client: Client, agent: str, reward: float | None) -> str:
    (rollout,) = client.enqueue("what is the weather?")
    (claim,) = httpx.post(f"{server.url}/api/v1/claims", json={"worker_id": "w"}).json()
    attempt = claim["attempt"]["id"]
    llm = openai.OpenAI(base_url=f"{server.url}/rollout/{rollout.id}/attempt/{attempt}/v1", api_key="k", max_retries=0)
    llm.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], extra_headers={HEADER_AGENT: agent}
    )
    body = {"status": "succeeded", "reward": reward, "error": None, "after_llm_seq": 0}
    httpx.post(f"{server.url}/api/v1/attempts/{attempt}/complete", json=body).raise_for_status()
    return rollout.id


def test_the_summary_names_every_stored_agent_and_each_rollout_left_out(agl_server: ServerProcess) -> None:
    with Client(agl_server.url) as client:
        kept = one_rollout(agl_server, client, "weather", 1.0)
        unrewarded = one_rollout(agl_server, client, "weather_stream", None)
    shown = subprocess.run(
        [sys.executable, "-m", "agl.cli.main", "export", f"--server={agl_server.url}", "--agents=writer"],
        capture_output=True,
        text=True,
        timeout=120,
    ).stderr
    assert "the selection kept no call; agent names stored in these rollouts: weather, weather_stream" in shown, shown
    assert f"no reward: 1 ({unrewarded})" in shown and f"no trainable call of a selected agent: 1 ({kept})" in shown
    rows = {row[0]: row[1:] for line in shown.splitlines() if (row := [c for c in line.split() if c != "│"])}
    assert rows["weather_stream"] == ["no", "0", "1"] and rows["weather"] == ["no", "0", "1"]


def test_a_rollouts_name_shown_per_reason_is_capped(tmp_path: Path) -> None:
    from agl.learn.transitions import DROPPED_IDS_SHOWN, BuildStats

    first, second = BuildStats(), BuildStats()
    for i in range(4):
        first.drop_rollout("no reward", f"r{i}")
        second.drop_rollout("no reward", f"s{i}")
    first.merge(second)
    assert first.dropped_rollouts["no reward"] == 8
    assert first.dropped_rollout_ids["no reward"] == ["r0", "r1", "r2", "r3", "s0"][:DROPPED_IDS_SHOWN]
