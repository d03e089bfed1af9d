"""`instrument()` / `uninstrument()`: idempotent, removable, no import-time effect, nothing exported to OpenAI
during a rollout, and the app unchanged outside one."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from typing import Any

import pytest
from agents import OpenAIChatCompletionsModel, RunConfig, Runner
from agents import tool as sdk_tool
from agents.run_internal import tool_execution
from agents.tracing import Span, Trace, add_trace_processor, set_trace_processors
from agents.tracing.processors import default_processor
from openai import AsyncOpenAI

import agl
import agl_openai_agents
from agl.client import Client
from agl.common.processes import ServerProcess
from agl_openai_agents import AglTracingProcessor, OutsideRollouts
from openai_agents_support import TASK, Collecting, load_example, run_one, trace_processors

example = load_example()


@agl.rollout
async def solve_uninstrumented(task: dict[str, Any], llm: agl.LLM) -> float:
    """The example app without its `instrument()` line."""
    async with AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key) as client:
        model = OpenAIChatCompletionsModel(model=llm.model, openai_client=client)
        config = RunConfig(model=model)
        result = await Runner.run(example.build_agents(task["instructions"]), task["question"], run_config=config)
    return float(example.reward(result.final_output, task["answer"]))


def test_importing_the_package_registers_nothing() -> None:
    code = (
        "import agl_openai_agents, agents.tracing.setup as setup\n"
        "assert setup.GLOBAL_TRACE_PROVIDER is None, 'trace provider created at import'\n"
        "assert not agl_openai_agents.is_instrumented()\n"
        "import agents.tool\n"
        "assert not hasattr(agents.tool.maybe_invoke_function_tool_failure_error_function, '__wrapped__')\n"
        "from agents.tracing import get_trace_provider\n"
        "print([type(p).__name__ for p in get_trace_provider()._multi_processor._processors])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "['BatchTraceProcessor']"


def test_instrument_is_idempotent_and_uninstrument_restores_the_processors() -> None:
    sdk_failure_handler = sdk_tool.maybe_invoke_function_tool_failure_error_function
    mine_before, mine_after = Collecting(), Collecting()
    add_trace_processor(mine_before)
    original = trace_processors()
    assert default_processor() in original

    agl_openai_agents.instrument()
    agl_openai_agents.instrument()
    add_trace_processor(mine_after)  # registered by the user while instrumented: kept afterwards
    installed = trace_processors()
    assert sum(isinstance(p, AglTracingProcessor) for p in installed) == 1
    (gate,) = [p for p in installed if isinstance(p, OutsideRollouts)]
    assert gate.inner is default_processor()
    assert default_processor() not in installed and mine_before in installed
    assert agl_openai_agents.is_instrumented()
    # The SDK's tool failure handler is wrapped (once) where it is called, so agl's tool spans get the reason.
    for module in (sdk_tool, tool_execution):
        wrapped = module.maybe_invoke_function_tool_failure_error_function
        assert wrapped is not sdk_failure_handler and wrapped.__wrapped__ is sdk_failure_handler  # type: ignore[attr-defined]

    agl_openai_agents.uninstrument()
    agl_openai_agents.uninstrument()
    assert trace_processors() == [*original, mine_after]
    assert not agl_openai_agents.is_instrumented()
    assert sdk_tool.maybe_invoke_function_tool_failure_error_function is sdk_failure_handler
    assert tool_execution.maybe_invoke_function_tool_failure_error_function is sdk_failure_handler

    # If the user replaced the processors in between, `instrument()` puts agl's back.
    agl_openai_agents.instrument()
    set_trace_processors([mine_before])
    assert not agl_openai_agents.is_instrumented()
    agl_openai_agents.instrument()
    assert agl_openai_agents.is_instrumented()


def test_after_uninstrument_calls_are_no_longer_attributed(agl_server: ServerProcess, agl_client: Client) -> None:
    agl_openai_agents.instrument()
    assert [c.agent_name for c in run_one(solve_uninstrumented, agl_server, agl_client).llm_calls] == [
        "triage",
        "triage",
        "math",
        "math",
    ]
    agl_openai_agents.uninstrument()
    detail = run_one(solve_uninstrumented, agl_server, agl_client)
    assert len(detail.llm_calls) == 4
    assert all(c.agent_name is None and c.attribution.value == "unattributed" for c in detail.llm_calls)
    assert not [s for s in detail.spans if s.name.startswith(("tool:", "agent:"))]


def test_openai_export_sees_nothing_of_a_rollout_but_everything_outside_one(
    agl_server: ServerProcess, agl_client: Client, agl_upstream: str, openai_export: Collecting
) -> None:
    exporter = openai_export
    agl_openai_agents.instrument()

    detail = run_one(example.solve, agl_server, agl_client)
    assert [c.agent_name for c in detail.llm_calls] == ["triage", "triage", "math", "math"]
    assert exporter.items == []

    reward = asyncio.run(example.solve(TASK, agl.LLM(base_url=agl_upstream, model="m", api_key="k")))
    assert reward == 1.0
    assert any(isinstance(item, Trace) for item in exporter.items)
    assert len([i for i in exporter.items if isinstance(i, Span)]) >= 6  # agents, generations, tools, handoff


def test_outside_a_rollout_the_instrumented_app_runs_unchanged(agl_upstream: str) -> None:
    llm = agl.LLM(base_url=agl_upstream, model="m", api_key="k")
    agl_openai_agents.instrument()
    assert asyncio.run(example.solve(TASK, llm)) == 1.0
    assert asyncio.run(example.solve({**TASK, "question": "What is 7 / 0?"}, llm)) == 0.0
    assert agl.current_agent() is None and agl.current_rollout() is None


def test_disabled_sdk_tracing_is_reported(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    with caplog.at_level(logging.WARNING, logger="agl_openai_agents.instrumentation"):
        agl_openai_agents.instrument()
    assert "unattributed" in caplog.text
