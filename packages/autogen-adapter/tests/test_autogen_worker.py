"""The example app as a user runs it: `agl worker examples/calculator_team.py:solve` in its own process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agl.client import Client
from agl.processes import ServerProcess
from agl.selection import AgentSelection
from agl.testing.fixtures import wait_rollouts
from agl.transitions import build_episodes

EXAMPLE_PATH = Path(__file__).resolve().parents[1] / "examples" / "calculator_team.py"
SCRIPT = {
    "solver_prompt": "Use the calculator.\nagl-tools: calculator\nagl-say: The answer is {tool}.",
    "verifier_prompt": "Check the answer.\nagl-say: APPROVE",
}


def test_example_runs_in_an_agl_worker(agl_server: ServerProcess, agl_client: Client, agl_workers: Any) -> None:
    agl_workers(f"{EXAMPLE_PATH}:solve", agl_server.url, concurrency=2)
    tasks = [
        {"question": "What is 12+30?", "answer": 42, **SCRIPT},
        {"question": "What is 9*8?", "answer": 72, **SCRIPT},
        {"question": "What is 7/0?", "answer": 0, **SCRIPT},
    ]
    ids = [r.id for task in tasks for r in agl_client.enqueue(task)]
    rollouts = wait_rollouts(agl_client, ids, timeout=60)
    assert [r.status.value for r in rollouts] == ["succeeded"] * 3
    details = agl_client.rollout_details(ids)
    details.sort(key=lambda d: ids.index(d.rollout.id))
    for detail in details:
        calls = sorted(detail.llm_calls, key=lambda c: c.seq)
        assert [(c.agent_name, c.attribution.value) for c in calls] == [
            ("solver", "scope"),
            ("solver", "scope"),
            ("verifier", "scope"),
        ]
    assert [[r.value for r in d.rewards if r.name == "final"] for d in details] == [[1.0], [1.0], [0.0]]
    tool_status = [[s.status.value for s in d.spans if s.name == "tool:calculator"] for d in details]
    assert tool_status == [["ok"], ["ok"], ["error"]]

    episodes, _ = build_episodes(details, AgentSelection.parse("solver"))
    assert {t.agent_name for ep in episodes for t in ep.transitions} == {"solver"}
    assert sum(len(ep.transitions) for ep in episodes) == 6
