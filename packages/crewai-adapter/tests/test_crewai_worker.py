"""The example app, unchanged, in a real `agl worker` process."""

from __future__ import annotations

from crewai_helpers import EXAMPLE_PATH

from agl.client import Client
from agl.common.processes import ServerProcess
from agl.learn.selection import AgentSelection
from agl.learn.transitions import build_episodes
from agl.testing.fixtures import StartWorker, wait_rollouts


def test_example_crew_trains_from_a_worker(
    agl_server: ServerProcess, agl_client: Client, agl_workers: StartWorker
) -> None:
    agl_workers(f"{EXAMPLE_PATH}:research_crew", agl_server.url)
    tasks = [{"question": "What is 12 + 30?", "answer": 42}, {"question": "What is 7 / 0?", "answer": -1}]
    ids = [r.id for task in tasks for r in agl_client.enqueue(task)]
    rollouts = wait_rollouts(agl_client, ids, timeout=90)
    assert [r.status.value for r in rollouts] == ["succeeded", "succeeded"], [r.error for r in rollouts]
    assert [r.final_reward for r in rollouts] == [1.0, 0.0]
    details = [agl_client.rollout_detail(i) for i in ids]
    for detail in details:
        calls = sorted(detail.llm_calls, key=lambda c: c.seq)
        assert [c.agent_name for c in calls] == ["Researcher", "Researcher", "Writer"]
    assert [[s.status.value for s in d.spans if s.name == "tool:calculator"] for d in details] == [["ok"], ["error"]]
    episodes, _ = build_episodes(details, AgentSelection.parse("Writer"))
    assert [[t.agent_name for t in e.transitions] for e in episodes] == [["Writer"], ["Writer"]]
