"""smolagents through OpenInference spans and agl_otel: the manager's and the managed solver's calls each under
their own agent (the request each carries is that agent's), the solver's tool spans with ok/error, through real
`agl serve` and `agl worker` processes against the scripted backend."""

from __future__ import annotations

from typing import Any

import pytest

from agl.client import Client
from agl.common import attributes as attr
from agl.common.processes import ServerProcess
from agl.learn.selection import AgentSelection
from agl.learn.transitions import build_episodes
from agl.testing.fixtures import wait_rollouts
from otel_support import EXAMPLES, assert_exact_ids, tool_spans

pytest.importorskip("smolagents", reason="smolagents is not installed: pip install smolagents")
pytest.importorskip(
    "openinference.instrumentation.smolagents",
    reason="OpenInference's smolagents instrumentation is not installed: pip install openinference-instrumentation-smolagents",
)


def _instructions_of(call: Any) -> str | None:
    """The agent whose instructions the request's system message carries (`You are <name>.`); None for the
    prompt smolagents sends without them (the final answer it asks for once an agent runs out of steps)."""
    system = str(call.request["messages"][0]["content"])
    named = [n for n in ("manager", "solver") if f"You are {n}." in system]
    return named[0] if named else None


def test_a_managed_agent_and_a_failing_tool_through_a_real_worker(
    agl_server: ServerProcess, agl_client: Client, agl_workers: Any
) -> None:
    tasks = [{"question": "What is 12 * 7?", "answer": 84}, {"question": "What is 9 / 0?", "answer": 0}]
    ids = [r.id for task in tasks for r in agl_client.enqueue(task)]
    agl_workers(f"{EXAMPLES / 'smolagents_managed.py'}:solve", agl_server.url)
    assert [r.status.value for r in wait_rollouts(agl_client, ids, timeout=180)] == ["succeeded", "succeeded"]
    details = [agl_client.rollout_detail(i) for i in ids]
    for detail in details:
        calls = sorted(detail.llm_calls, key=lambda c: c.seq)
        assert calls[0].agent_name == "manager" and calls[1].agent_name == "solver"
        # every call is stored under the agent that sent it, however smolagents' steps went
        sent = [(c.agent_name, _instructions_of(c)) for c in calls]
        assert all(agent == by for agent, by in sent if by is not None), sent
        assert {agent for agent, _ in sent} == {"manager", "solver"}
        assert all(c.trainable and c.prompt_ids and c.response_ids for c in calls)
        assert_exact_ids(detail)
        assert {s.name for s in detail.spans if s.attributes.get(attr.SPAN_KIND) == "agent"} == {
            "agent:manager",
            "agent:solver",
        }
    first, second = ([(s.status.value, s.status_message, s.agent_name) for s in tool_spans(d)] for d in details)
    assert first[0] == ("ok", None, "solver")  # calculator("12*7")
    assert second[0] == ("error", "ZeroDivisionError: division by zero", "solver")  # calculator("9/0")
    assert all(s.attributes[attr.TOOL_NAME] == "calculator" for d in details for s in tool_spans(d))

    episodes, stats = build_episodes(details, AgentSelection.parse("solver"))
    trained = [t.agent_name for e in episodes for t in e.transitions]
    assert trained and set(trained) == {"solver"}
    assert stats.dropped_calls["agent not selected"] == sum(
        c.agent_name == "manager" for d in details for c in d.llm_calls
    )
