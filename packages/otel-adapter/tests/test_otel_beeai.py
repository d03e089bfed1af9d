"""BeeAI through OpenInference's BeeAI instrumentor and agl_otel: a `RequirementAgent` planner hands each question off
to a solver (`HandoffTool`), each call stored under the agent that sent it although the instrumentor writes no span
until the outermost agent has finished (agl_otel.runtime_agents reads BeeAI's run contexts); the solver's calculator
with its real arguments; BeeAI's greedy calls trained when the run owns the agents' sampling. Real
`agl serve` and `agl worker` processes against the scripted backend."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agl.client import Client
from agl.common.processes import ServerProcess, start_server
from agl.learn.selection import AgentSelection
from agl.learn.transitions import build_episodes
from otel_support import assert_exact_ids, run_example, tool_spans

pytest.importorskip("beeai_framework", reason="BeeAI is not installed: pip install beeai-framework")
pytest.importorskip(
    "openinference.instrumentation.beeai",
    reason="OpenInference's BeeAI instrumentation is not installed: pip install openinference-instrumentation-beeai",
)

EXAMPLE = "beeai_handoff"
TASKS = [{"question": "What is 12 * 7?", "answer": 84}, {"question": "What is 9 + 5?", "answer": 14}]


@pytest.fixture
def owning_server(tmp_path: Path, agl_upstream: str) -> Iterator[ServerProcess]:
    """`agl serve` as `agl train --agents planner,solver` starts it: the run samples these agents' training calls."""
    server = start_server(tmp_path / "run", upstream=agl_upstream, extra_args=["--own-sampling-for=planner,solver"])
    yield server
    server.stop()


def opening(call: Any) -> str:
    """Which agent's instructions the request carries (BeeAI writes them into its own system prompt)."""
    system = str(call.request["messages"][0]["content"])
    return "planner" if "You are planner" in system else "solver" if "You are solver" in system else system[:80]


def test_a_handoff_stores_each_call_under_its_agent_through_a_real_worker(
    owning_server: ServerProcess, agl_workers: Any, tmp_path: Path
) -> None:
    with Client(owning_server.url) as client:
        details = run_example(EXAMPLE, owning_server, client, agl_workers, TASKS, statuses=["succeeded"] * 2)
    assert [d.rollout.final_reward for d in details] == [1.0, 1.0]  # the planner's answer holds the solver's
    for detail in details:
        sent = [(c.agent_name, opening(c)) for c in detail.llm_calls]
        # the planner hands off, the solver calls its calculator and answers, the planner answers
        assert sent == [("planner", "planner"), ("solver", "solver"), ("solver", "solver"), ("planner", "planner")]
        # BeeAI asked for temperature 0; the run sampled at its own and keeps what BeeAI asked
        assert all(c.trainable and c.request.get("temperature") == 0 for c in detail.llm_calls), [
            c.not_trainable_reason for c in detail.llm_calls
        ]
        assert_exact_ids(detail)
        # the spans OpenInference writes once the planner has finished, each under its agent; BeeAI's event spans
        # (`final_answer`, of the agent kind) are no agents, and the two rollouts ran at once in one worker
        spans = [(s.name, s.agent_name) for s in sorted(detail.spans, key=lambda s: s.start_time)]
        assert spans == [
            ("agent:planner", "planner"),
            ("tool:solver", "planner"),  # the handoff
            ("agent:solver", "solver"),
            ("tool:calculator", "solver"),
            ("tool:final_answer", "solver"),
            ("tool:final_answer", "planner"),
        ], spans
    # each calculator span holds its call's arguments
    calculators = [next(s for s in tool_spans(d) if s.name == "tool:calculator") for d in details]
    assert ["12*7" in str(calculators[0].attributes), "9+5" in str(calculators[1].attributes)] == [True, True]

    episodes, stats = build_episodes(details, AgentSelection.parse("solver"))
    trained = [t.agent_name for e in episodes for t in e.transitions]
    assert trained and set(trained) == {"solver"}
    assert stats.dropped_calls["agent not selected"] == 4
    log = (tmp_path / "worker-0.log").read_text()
    assert "without an agent name" not in log, log


def test_an_app_that_instruments_before_importing_beeai_gets_its_reader_at_the_next_instrument(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`agl_otel.instrument()` at start-up, BeeAI imported later: the first call cannot listen to BeeAI's runs yet,
    and a later call (the one in the rollout function) must not return early as "already instrumented"."""
    import sys

    import agl_otel
    from agl_otel import runtime_agents

    beeai = sys.modules["beeai_framework"]
    monkeypatch.setattr(runtime_agents, "_beeai", None)
    monkeypatch.delitem(sys.modules, "beeai_framework")  # not imported yet
    agl_otel.instrument()
    assert runtime_agents._beeai is None and not runtime_agents.awaited()
    monkeypatch.setitem(sys.modules, "beeai_framework", beeai)  # the app imports BeeAI
    assert runtime_agents.awaited()
    agl_otel.instrument()
    reader = runtime_agents._beeai
    assert reader is not None and not runtime_agents.awaited()
    reader.cleanup()  # its listener leaves BeeAI's root emitter with the test
