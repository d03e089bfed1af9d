"""The example app as a user runs it: `agl worker examples/calculator_team.py:solve` in its own process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agl.client import Client
from agl.common.processes import ServerProcess
from agl.learn.selection import AgentSelection
from agl.learn.transitions import build_episodes
from agl.testing.fixtures import wait_rollouts

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
    rollouts = wait_rollouts(agl_client, ids)
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


def test_a_team_shared_by_concurrent_rollouts_fails_with_the_fix_named(tmp_path: Path, agl_workers: Any) -> None:
    """AutoGen's module-level team under a worker running rollouts at once: AgentChat refuses the second run of a
    running team; the attempt's error says why under agl and the two fixes."""
    from agl.common.processes import start_server
    from agl.testing.upstream import start_upstream_process

    proc, slow = start_upstream_process(delay_s=1.0)  # each team run lasts long enough for the others to collide
    server = start_server(tmp_path / "run", upstream=slow)
    try:
        with Client(server.url) as client:
            # queued before the worker starts, so that its three slots claim them at once: enqueued one by one
            # beside a starting worker on a loaded machine, they can be claimed (and run) one after the other
            ids = [r.id for i in range(3) for r in client.enqueue({"question": f"q{i}"}, max_attempts=1)]
            agl_workers(f"{Path(__file__).with_name('module_team_app.py')}:answer", server.url, concurrency=3)
            rollouts = wait_rollouts(client, ids)
            failed = [r for r in rollouts if r.status.value == "failed"]
            assert failed, "no run collided with another"
            for rollout in failed:
                error = client.rollout_detail(rollout.id).attempts[0].error or ""
                assert "The group chat is currently running" in error
                assert "shared by rollouts running at the same time" in error and "--concurrency 1" in error
    finally:
        server.stop()
        proc.terminate()
        proc.wait(10)
