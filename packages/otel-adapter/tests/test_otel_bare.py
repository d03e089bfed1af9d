"""No framework: a plain OpenAI client under OpenTelemetry spans in the GenAI conventions (and OpenInference's)
is attributed by agl_otel, through real `agl serve` and `agl worker` processes and in this process."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from openai import AsyncOpenAI, OpenAI
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

import agl
import agl_otel
from agl.client import Client
from agl.common import attributes as attr
from agl.common.processes import ServerProcess
from agl.learn.air import ToolStatusRule, with_air
from agl.learn.selection import AgentSelection
from agl.learn.transitions import build_episodes
from agl.testing.fixtures import run_one, wait_rollouts
from otel_support import EXAMPLES, agents_of_calls, assert_exact_ids, load_example, tool_spans

bare = load_example("bare_otel")


def test_the_example_trains_through_a_real_worker(
    agl_server: ServerProcess, agl_client: Client, agl_workers: Any
) -> None:
    tasks = [{"question": "What is 12 * 7?", "answer": 84}, {"question": "What is 9 / 0?", "answer": 0}]
    ids = [r.id for task in tasks for r in agl_client.enqueue(task)]
    agl_workers(f"{EXAMPLES / 'bare_otel.py'}:solve", agl_server.url)
    assert [r.status.value for r in wait_rollouts(agl_client, ids)] == ["succeeded", "succeeded"]
    details = [agl_client.rollout_detail(i) for i in ids]
    for detail in details:
        detail.llm_calls.sort(key=lambda c: c.seq)
        # the planner's call, then the solver's two (tool call, answer): the innermost agent's span names each
        assert agents_of_calls(detail) == ["planner", "solver", "solver"]
        assert [c.agent_key for c in detail.llm_calls] == [None, "s-1", "s-1"]
        assert all(c.trainable and c.prompt_ids and c.response_ids for c in detail.llm_calls)
        assert_exact_ids(detail)
        agent_spans = {s.name for s in detail.spans if s.attributes.get(attr.SPAN_KIND) == "agent"}
        assert agent_spans == {"agent:planner", "agent:solver"}
    assert [[r.value for r in d.rewards] for d in details] == [[1.0], [0.0]]
    (ok,), (failed,) = (tool_spans(d) for d in details)
    assert (ok.status.value, ok.agent_name, ok.attributes[attr.TOOL_NAME]) == ("ok", "solver", "calculator")
    assert failed.status.value == "error" and failed.status_message == "ZeroDivisionError: division by zero"
    assert failed.attributes[attr.AFTER_LLM_SEQ] == 1  # after the solver's tool call: AIR's tool rule reward goes there

    # AIR's tool rule reads these spans unchanged: the failed calculator penalises the solver's tool call
    air = [
        [(r.name, r.value, r.after_llm_seq) for r in with_air(d, [ToolStatusRule(error_reward=-0.5)]).rewards]
        for d in details
    ]
    assert [[r for r in rewards if r[0] == "air:tool_status"] for rewards in air] == [
        [],
        [("air:tool_status", -0.5, 1)],
    ]

    episodes, stats = build_episodes(details, AgentSelection.parse("sol*"))
    assert [t.agent_name for e in episodes for t in e.transitions] == ["solver"] * 4
    assert stats.dropped_calls == {"agent not selected": 2}


@pytest.fixture
def provider() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """The app's own tracer provider, exporting to memory: agl's processor goes beside its exporter."""
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    agl_otel.instrument(tracer_provider=tp)
    yield tp, exporter
    tp.shutdown()


def _agent(tp: TracerProvider, name: str) -> Any:
    return tp.get_tracer("t").start_as_current_span(
        f"invoke_agent {name}", attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name}
    )


def _ask(llm: agl.LLM, text: str) -> None:
    OpenAI(base_url=llm.base_url, api_key=llm.api_key).chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": text}]
    )


def test_nested_agents_give_the_innermost_and_the_outer_comes_back(
    provider: tuple[TracerProvider, InMemorySpanExporter], agl_server: ServerProcess, agl_client: Client
) -> None:
    tp, exporter = provider

    @agl.rollout
    def app(task: Any, llm: agl.LLM) -> float:
        _ask(llm, "before any agent")
        with _agent(tp, "manager"):
            _ask(llm, "m1")
            with _agent(tp, "worker"):
                _ask(llm, "w1")
                with tp.get_tracer("t").start_as_current_span("some other span"):
                    _ask(llm, "w2 deeper")
            _ask(llm, "m2")
        return 1.0

    detail = run_one(app, agl_server, agl_client, "go")
    assert agents_of_calls(detail) == [None, "manager", "worker", "worker", "manager"]
    # the app's exporter saw every span, agl's processor changed none of them
    assert sorted(s.name for s in exporter.get_finished_spans()) == [
        "invoke_agent manager",
        "invoke_agent worker",
        "some other span",
    ]


def test_concurrent_agents_in_tasks_and_threads_keep_their_own_names(
    provider: tuple[TracerProvider, InMemorySpanExporter], agl_server: ServerProcess, agl_client: Client
) -> None:
    tp, _ = provider

    @agl.rollout
    async def app(task: Any, llm: agl.LLM) -> float:
        client = AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key)

        async def agent(name: str) -> None:
            with _agent(tp, name):
                for turn in range(2):
                    await client.chat.completions.create(
                        model=llm.model, messages=[{"role": "user", "content": f"{name} {turn}"}]
                    )
                    await asyncio.sleep(0)

        await asyncio.gather(agent("alpha"), agent("beta"), agent("gamma"))

        def in_thread() -> None:
            _ask(llm, "from a thread")

        with _agent(tp, "threaded"):  # a thread started with the context, as frameworks do for their own spans
            ctx = contextvars.copy_context()
            t = threading.Thread(target=ctx.run, args=(in_thread,))
            t.start()
            t.join()
        await client.close()
        return 1.0

    detail = run_one(app, agl_server, agl_client, "go")
    by_text = {c.request["messages"][0]["content"]: c.agent_name for c in detail.llm_calls}
    assert by_text == {
        **{f"{name} {turn}": name for name in ("alpha", "beta", "gamma") for turn in range(2)},
        "from a thread": "threaded",
    }


def test_openinference_agent_and_tool_spans(
    provider: tuple[TracerProvider, InMemorySpanExporter], agl_server: ServerProcess, agl_client: Client
) -> None:
    tp, _ = provider
    tracer = tp.get_tracer("oi")

    @agl.rollout
    def app(task: Any, llm: agl.LLM) -> float:
        with tracer.start_as_current_span("researcher.run", attributes={"openinference.span.kind": "AGENT"}):
            _ask(llm, "look it up")
            with tracer.start_as_current_span(
                "SearchTool", attributes={"openinference.span.kind": "TOOL", "tool.name": "search"}
            ) as span:
                span.set_status(Status(StatusCode.ERROR, "HTTPError: 503"))
            with tracer.start_as_current_span(
                "SearchTool",
                attributes={"openinference.span.kind": "TOOL", "tool.name": "search", "output.value": "ok"},
            ):
                pass
        return 1.0

    detail = run_one(app, agl_server, agl_client, "go")
    assert agents_of_calls(detail) == ["researcher"]
    failed, ok = tool_spans(detail)
    assert (failed.status.value, failed.status_message, failed.agent_name) == ("error", "HTTPError: 503", "researcher")
    assert (ok.status.value, ok.attributes[attr.TOOL_RESULT]) == ("ok", "ok")


def test_outside_a_rollout_and_after_uninstrument_nothing_is_attributed(
    provider: tuple[TracerProvider, InMemorySpanExporter], agl_server: ServerProcess, agl_client: Client
) -> None:
    tp, exporter = provider
    with _agent(tp, "nobody"):  # no rollout: the processor does nothing, the app's exporter still gets it
        pass
    assert [s.name for s in exporter.get_finished_spans()] == ["invoke_agent nobody"]

    @agl.rollout
    def app(task: Any, llm: agl.LLM) -> float:
        with _agent(tp, "planner"):
            _ask(llm, "x")
        return 1.0

    agl_otel.uninstrument()
    assert not agl_otel.is_instrumented()
    assert agents_of_calls(run_one(app, agl_server, agl_client, "go")) == [None]
    agl_otel.instrument(tracer_provider=tp)  # the same processor, enabled again (never added twice)
    assert agents_of_calls(run_one(app, agl_server, agl_client, "go")) == ["planner"]
