"""Helpers shared by the adapter's tests (a module name of its own: other packages' test folders sit beside this one)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from agents.tracing import Span as SdkSpan
from agents.tracing import Trace, TracingProcessor, get_trace_provider

from agl.client import Client
from agl.common.processes import ServerProcess
from agl.schema import LLMCall, RolloutDetail, Span
from agl.testing import fixtures

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "triage_handoff.py"

# The scripted upstream calls the tools an `agl-tools:` line names, in order, then answers "The answer is X".
# Every agent's instructions start with `You are <name>.`, so a stored call's request says who really sent it.
SCRIPTED = {
    "triage": "You are triage.\nagl-tools: classify, transfer_to_math",
    "math": "You are math.\nagl-tools: calculator",
}
TASK: dict[str, Any] = {"question": "What is 12 * 7?", "answer": 84, "instructions": SCRIPTED}


class Collecting(TracingProcessor):
    """Stands in for the SDK's OpenAI exporter: keeps what it is given."""

    def __init__(self) -> None:
        self.items: list[Trace | SdkSpan[Any]] = []

    def on_trace_start(self, trace: Trace) -> None:
        self.items.append(trace)

    def on_trace_end(self, trace: Trace) -> None:
        pass

    def on_span_start(self, span: SdkSpan[Any]) -> None:
        pass

    def on_span_end(self, span: SdkSpan[Any]) -> None:
        self.items.append(span)

    def shutdown(self) -> None:
        pass

    def force_flush(self) -> None:
        pass


def load_example() -> ModuleType:
    """The example app as a module, loaded from its path as `agl worker` loads it."""
    if "triage_handoff" not in sys.modules:
        spec = importlib.util.spec_from_file_location("triage_handoff", EXAMPLE)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["triage_handoff"] = module
        spec.loader.exec_module(module)
    return sys.modules["triage_handoff"]


def trace_processors() -> list[TracingProcessor]:
    return list(get_trace_provider()._multi_processor._processors)  # type: ignore[attr-defined]


def run_one(app: Any, server: ServerProcess, client: Client, task: Any = TASK) -> RolloutDetail:
    """Run one rollout of `app` in an in-process agl runner; what the store holds about it."""
    return fixtures.run_one(app, server, client, task)


def sent_by(call: LLMCall) -> str:
    """The agent whose instructions the request carries (its system message starts `You are <name>.`)."""
    system = call.request["messages"][0]
    assert system["role"] == "system"
    return str(system["content"]).split(".")[0].removeprefix("You are ")


def spans_named(detail: RolloutDetail, prefix: str) -> list[Span]:
    return sorted((s for s in detail.spans if s.name.startswith(prefix)), key=lambda s: s.start_time)


def final_reward(detail: RolloutDetail) -> float:
    (final,) = [r for r in detail.rewards if r.source.value == "returned"]
    return float(final.value)
