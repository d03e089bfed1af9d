"""The example app: its calculator and reward, and a run through a real `agl worker` process."""

from __future__ import annotations

import pytest

from agl.client import Client
from agl.common.processes import ServerProcess
from agl.learn.selection import AgentSelection
from agl.learn.transitions import build_episodes
from agl.testing.fixtures import wait_rollouts
from openai_agents_support import EXAMPLE, SCRIPTED, load_example, sent_by

example = load_example()


@pytest.mark.parametrize(
    ("expression", "value"),
    [("12*7", 84), ("2 + 3 * (4 - 1)", 11), ("-2 ** 3", -8), ("7 / 2", 3.5), ("17 // 5 + 17 % 5", 5), ("1.5e3", 1500)],
)
def test_calculator_evaluates_arithmetic(expression: str, value: float) -> None:
    assert example.evaluate(expression) == value


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os').system('true')",
        "x + 1",
        "abs(-1)",
        "1 / 0",
        "2 ** 1000",
        "1e300 ** 99",
        "True + 1",
        "1 +",
        "'a' * 3",
    ],
)
def test_calculator_refuses_anything_but_arithmetic(expression: str) -> None:
    with pytest.raises(ValueError):
        example.evaluate(expression)


def test_reward_reads_the_last_number_of_the_answer() -> None:
    assert example.reward("The answer is 84.", 84) == 1.0
    assert example.reward("12 * 7 = 1,008? no: 84", 84) == 1.0
    assert example.reward("The answer is 85", 84) == 0.0
    assert example.reward("I cannot tell.", 84) == 0.0


def test_example_runs_in_an_agl_worker(agl_server: ServerProcess, agl_client: Client, agl_workers: object) -> None:
    tasks = [
        {"question": "What is 12 * 7?", "answer": 84, "instructions": SCRIPTED},
        {"question": "What is 640 - 17?", "answer": 623, "instructions": SCRIPTED},
        {"question": "What is 9 / 0?", "answer": 0, "instructions": SCRIPTED},
    ]
    ids = [r.id for task in tasks for r in agl_client.enqueue(task)]
    agl_workers(f"{EXAMPLE}:solve", agl_server.url)  # type: ignore[operator]
    rollouts = wait_rollouts(agl_client, ids)
    assert [r.status.value for r in rollouts] == ["succeeded"] * 3

    details = [agl_client.rollout_detail(i) for i in ids]
    for detail in details:
        calls = sorted(detail.llm_calls, key=lambda c: c.seq)
        assert [c.agent_name for c in calls] == ["triage", "triage", "math", "math"]
        assert all(c.agent_name == sent_by(c) for c in calls)
    assert [[r.value for r in d.rewards] for d in details] == [[1.0], [1.0], [0.0]]
    calculator_status = [[s.status.value for s in d.spans if s.name == "tool:calculator"] for d in details]
    assert calculator_status == [["ok"], ["ok"], ["error"]]

    episodes, stats = build_episodes(details, AgentSelection.parse("math"))
    assert [t.agent_name for e in episodes for t in e.transitions] == ["math"] * 6
    assert stats.dropped_calls == {"agent not selected": 6}
