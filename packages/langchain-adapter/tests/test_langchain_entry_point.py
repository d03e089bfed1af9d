"""The entry point: no import-time side effects, idempotent, removable, and inert outside a rollout."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from typing import Any

from langchain_core.tracers import context as lc_hooks
from lc_support import EXAMPLE_AGENTS, SCRIPT, TASK, agent_spans, calls, load_example, run_rollout, tool_spans

import agl
import agl_langchain
from agl.client import Client
from agl.common.processes import ServerProcess
from agl.testing.upstream import start_upstream_process
from agl_langchain import AglCallbackHandler, has_agl, with_agl
from agl_langchain import handler as handler_module

example = load_example()


def test_importing_patches_and_registers_nothing() -> None:
    probe = """
import httpx
from langchain_core.tracers import context as hooks
send, asend, n_hooks = httpx.Client.send, httpx.AsyncClient.send, len(hooks._configure_hooks)
import agl_langchain
assert httpx.Client.send is send and httpx.AsyncClient.send is asend
assert len(hooks._configure_hooks) == n_hooks and not agl_langchain.is_instrumented()
import agl
assert agl.current_agent() is None
print("clean")
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "clean", out.stderr


@agl.rollout
def twice_instrumented_app(task: Any, llm: agl.LLM) -> None:
    """The handler bound to the graph (twice) and passed again at invoke: it must act once."""
    model = example.ChatOpenAI(base_url=llm.base_url, api_key=llm.api_key, model=llm.model)
    graph = with_agl(with_agl(example.build_graph(model, SCRIPT)))
    assert len(graph.config["callbacks"]) == 1
    graph.invoke(example.essay_input(TASK), {"callbacks": [AglCallbackHandler(), AglCallbackHandler()]})


def test_installing_twice_acts_once(agl_server: ServerProcess, agl_client: Client) -> None:
    detail = run_rollout(twice_instrumented_app, agl_server, agl_client)
    assert [c.agent_name for c in calls(detail)] == EXAMPLE_AGENTS
    assert len(tool_spans(detail)) == 2
    assert Counter(s.agent_name for s in agent_spans(detail)) == {"checker": 4, "tools": 2, "writer": 1, "rewriter": 1}


@agl.rollout
def uninstrumented_app(task: Any, llm: agl.LLM) -> None:
    """`with_agl` returns a copy: the original graph runs as if agl were not there."""
    model = example.ChatOpenAI(base_url=llm.base_url, api_key=llm.api_key, model=llm.model)
    graph = example.build_graph(model, SCRIPT)
    traced = with_agl(graph)
    assert has_agl(traced) and not has_agl(graph)
    graph.invoke(example.essay_input(TASK))


def test_the_graph_without_the_handler_is_untouched(agl_server: ServerProcess, agl_client: Client) -> None:
    detail = run_rollout(uninstrumented_app, agl_server, agl_client)
    stored = calls(detail)
    assert len(stored) == 6  # still stored, but no agent is claimed and nothing is traced
    assert all(c.agent_name is None and c.attribution.value == "unattributed" for c in stored)
    assert detail.spans == []


def test_outside_a_rollout_the_app_runs_unchanged() -> None:
    proc, url = start_upstream_process()
    try:
        model = example.ChatOpenAI(base_url=url, api_key="none", model="any")
        graph = example.build_graph(model, SCRIPT)
        plain = graph.invoke(example.essay_input(TASK))
        traced = with_agl(graph).invoke(example.essay_input(TASK))
        streamed = list(graph.stream(example.essay_input(TASK), {"callbacks": [AglCallbackHandler()]}))
    finally:
        proc.terminate()
        proc.wait(10)
    assert plain["draft"] == traced["draft"] == "The moon pulls the tides."
    assert [next(iter(update)) for update in streamed] == [
        "writer",
        "checker",
        "tools",
        "checker",
        "rewriter",
        "checker",
        "tools",
        "checker",
    ]
    assert example.score(traced["draft"], TASK) == 1.0
    assert handler_module._runs == {} and agl.current_agent() is None


def test_the_handler_survives_a_langchain_run_that_raises(agl_server: ServerProcess, agl_client: Client) -> None:
    """A failed model call (HTTP 500) closes its runs: nothing stays open, nothing leaks into the next rollout."""

    @agl.rollout
    def failing_app(task: Any, llm: agl.LLM) -> None:
        model = example.ChatOpenAI(base_url=llm.base_url, api_key=llm.api_key, model=llm.model, max_retries=0)
        graph = example.build_graph(model, SCRIPT)
        state = example.essay_input({**TASK, "topic": "force_error:500"})
        graph.invoke(state, {"callbacks": [AglCallbackHandler()]})

    detail = run_rollout(failing_app, agl_server, agl_client, succeed=False)
    (call,) = calls(detail)
    assert call.agent_name == "writer" and call.status == "error"
    (span,) = agent_spans(detail)
    assert span.agent_name == "writer" and span.status.value == "error" and "500" in (span.status_message or "")
    assert handler_module._runs == {}


@agl.rollout
def plain_app(task: Any, llm: agl.LLM) -> None:
    """The example graph with no handler passed or bound: only `instrument()` can trace it."""
    model = example.ChatOpenAI(base_url=llm.base_url, api_key=llm.api_key, model=llm.model)
    example.build_graph(model, SCRIPT).invoke(example.essay_input(TASK))


def test_instrument_traces_every_run_once_and_uninstrument_removes_it(
    agl_server: ServerProcess, agl_client: Client
) -> None:
    hooks_before = list(lc_hooks._configure_hooks)
    try:
        agl_langchain.instrument()
        agl_langchain.instrument()  # idempotent: one hook
        assert len(lc_hooks._configure_hooks) == len(hooks_before) + 1 and agl_langchain.is_instrumented()
        for app in (plain_app, twice_instrumented_app):  # alone, and beside `with_agl` + handlers passed in
            detail = run_rollout(app, agl_server, agl_client)
            assert [c.agent_name for c in calls(detail)] == EXAMPLE_AGENTS
            assert len(tool_spans(detail)) == 2
            assert Counter(s.agent_name for s in agent_spans(detail)) == {
                "checker": 4,
                "tools": 2,
                "writer": 1,
                "rewriter": 1,
            }
    finally:
        agl_langchain.uninstrument()
        agl_langchain.uninstrument()  # a second removal is a no-op
    assert lc_hooks._configure_hooks == hooks_before and not agl_langchain.is_instrumented()
    detail = run_rollout(plain_app, agl_server, agl_client)
    assert all(c.agent_name is None and c.attribution.value == "unattributed" for c in calls(detail))
    assert detail.spans == []
