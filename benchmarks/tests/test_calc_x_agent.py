"""End to end: the Calc-X agent in a real `agl worker`, through the real proxy, against the scripted upstream.

The prompt overrides script the model: call the calculator on the question's `<int><op><int>`, then say
`Answer: {tool}` (the tool's result, or AutoGen's error text when the calculator raised). The scripted runs
leave out the worked exchanges (`shots: 0`): the script calls each tool once per conversation, and the worked
exchanges already hold a calculator call; a fourth run keeps them and checks that the model is shown them.
"""

from __future__ import annotations

from typing import Any

import pytest

from agl.client import Client
from agl.common.processes import ServerProcess
from agl.learn.air import air_rewards
from agl.schema import RolloutDetail
from agl.testing.fixtures import wait_rollouts
from agl_bench.calc_x.task import TASK
from agl_bench.results import read_outcome

SCRIPT = {"solver": "Use the calculator.\nagl-tools: calculator\nagl-say: Answer: {tool}"}


def _by_name(detail: RolloutDetail) -> dict[str, float]:
    return {r.name: r.value for r in air_rewards(detail, TASK.air_rules())}


@pytest.mark.slow
def test_agent_in_a_worker(agl_server: ServerProcess, agl_client: Client, agl_workers: Any) -> None:
    agl_workers(TASK.agent, agl_server.url, concurrency=3)
    tasks = [
        {"id": "mul", "question": "A box holds 12 rows of 34 eggs. What is 12*34?", "result": "408", "prompts": SCRIPT},
        {"id": "div0", "question": "Share 7 apples among 0 kids: 7/0 each?", "result": "0", "prompts": SCRIPT},
        {"id": "wrong", "question": "What is 12*34?", "result": "3_500", "prompts": SCRIPT},
    ]
    tasks = [{**task, "shots": 0} for task in tasks]
    shown = {"id": "shown", "question": "What is 2+2?", "result": "4", "prompts": {"solver": "agl-say: Answer: 4"}}
    ids = [r.id for task in [*tasks, shown] for r in agl_client.enqueue(task)]
    rollouts = wait_rollouts(agl_client, ids, timeout=60)
    assert [r.status.value for r in rollouts] == ["succeeded"] * 4, [
        d.attempts for d in agl_client.rollout_details(ids)
    ]
    mul, div0, wrong, with_shots = (agl_client.rollout_detail(i) for i in ids)

    # the worked exchanges reach the model as real tool calls and results, before the question
    (call,) = with_shots.llm_calls
    roles = [m["role"] for m in call.request["messages"]]
    assert roles == ["system", *["user", "assistant", "tool", "assistant"] * 2, "user"]
    assert call.request["messages"][2]["tool_calls"][0]["function"]["name"] == "calculator"
    assert call.request["messages"][-1]["content"] == "What is 2+2?"
    assert read_outcome(with_shots).metrics["accuracy"] == 1.0  # type: ignore[union-attr]

    for detail in (mul, div0, wrong):
        calls = sorted(detail.llm_calls, key=lambda c: c.seq)
        # the tool call, then the answer after seeing the tool's result: both stored under the agent's name
        assert [c.agent_name for c in calls] == list(TASK.agents) * 2
        assert set(TASK.trainable_agents) == {c.agent_name for c in calls}

    mul_tools = [s for s in mul.spans if s.name == "tool:calculator"]
    assert [s.status.value for s in mul_tools] == ["ok"]
    outcome = read_outcome(mul)
    assert outcome is not None
    assert outcome.metrics == {"accuracy": 1.0, "tool_calls": 1.0, "tool_errors": 0.0}
    assert (outcome.prediction, outcome.gold) == ("408", "408")
    assert [r.value for r in mul.rewards if r.name == "final"] == [1.0]
    assert _by_name(mul) == {}  # a clean run earns no penalty

    div0_tools = [s for s in div0.spans if s.name == "tool:calculator"]
    assert [s.status.value for s in div0_tools] == ["error"]
    assert "division by zero" in (div0_tools[0].status_message or "")
    outcome = read_outcome(div0)
    assert outcome is not None
    assert outcome.metrics == {"accuracy": 0.0, "tool_calls": 1.0, "tool_errors": 1.0}
    assert [r.value for r in div0.rewards if r.name == "final"] == [0.0]
    # the calculator's error, placed after the call that asked for it; the answer repeats the error: unreadable
    penalties = air_rewards(div0, TASK.air_rules())
    assert {r.name: r.value for r in penalties} == {"air:calculator_error": -0.1, "air:unparsable_answer": -0.5}
    first_call = min(c.seq for c in div0.llm_calls)
    assert [r.after_llm_seq for r in penalties if r.name == "air:calculator_error"] == [first_call]

    outcome = read_outcome(wrong)
    assert outcome is not None and outcome.metrics["accuracy"] == 0.0
    assert (outcome.prediction, outcome.gold) == ("408", "3_500")
    assert _by_name(wrong) == {}  # wrong but readable: no AIR penalty, reward 0
