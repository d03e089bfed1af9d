"""Loud when selection cannot work: agl_otel is in place, the framework's spans name no agent a convention knows,
and the worker says so once, with the spans it saw (issue #43)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agl.client import Client
from agl.common.processes import ServerProcess
from agl.testing.fixtures import wait_rollouts

APP = str(Path(__file__).with_name("unnamed_spans_app.py")) + ":solve"


def test_a_rollout_whose_calls_all_lack_an_agent_is_named_in_the_workers_log(
    agl_server: ServerProcess, agl_client: Client, agl_workers: Any, tmp_path: Path
) -> None:
    ids = [r.id for r in agl_client.enqueue({"q": "hi"}, n=2)]
    agl_workers(APP, agl_server.url)
    assert [r.status.value for r in wait_rollouts(agl_client, ids)] == ["succeeded", "succeeded"]
    calls = [c for i in ids for c in agl_client.rollout_detail(i).llm_calls]
    assert len(calls) == 4 and {c.agent_name for c in calls} == {None}
    log = (tmp_path / "worker-0.log").read_text()
    assert log.count("reached agl without an agent name") == 1, log  # once per worker, not per rollout
    assert "all 2 LLM call(s) of rollout" in log and "OTelInstrumentor" in log
    assert "agl_otel saw 3 span(s) start in it" in log and "plan.step (2), workflow.run (1)" in log


def test_a_langgraph_agent_made_without_a_name_is_told_the_fix(
    agl_server: ServerProcess, agl_client: Client, agl_workers: Any, tmp_path: Path
) -> None:
    """`create_agent(...)` without `name=`: LangGraph names no agent, 0 calls attributed, and the worker's warning
    says what to write (it said only which spans it saw)."""
    import pytest

    pytest.importorskip("langchain.agents")
    pytest.importorskip("openinference.instrumentation.langchain")
    app = str(Path(__file__).with_name("unnamed_langgraph_app.py")) + ":solve"
    ids = [r.id for r in agl_client.enqueue({"q": "hi"}, n=1)]
    agl_workers(app, agl_server.url)
    assert [r.status.value for r in wait_rollouts(agl_client, ids)] == ["succeeded"]
    assert {c.agent_name for c in agl_client.rollout_detail(ids[0]).llm_calls} == {None}
    log = (tmp_path / "worker-0.log").read_text()
    assert "reached agl without an agent name" in log and 'create_agent(model, tools, name="writer")' in log, log
