"""Helpers for the agl_otel tests: the example apps, and one rollout run in this process against a real server."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import agl
from agl.client import Client
from agl.processes import ServerProcess
from agl.schema import RolloutDetail, Span

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_example(name: str) -> ModuleType:
    """An example app as a module, loaded from its path as `agl worker` loads it."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def run_one(app: Any, server: ServerProcess, client: Client, task: Any) -> RolloutDetail:
    """Run one rollout of `app` in an in-process agl runner; what the store holds about it."""
    (rollout,) = client.enqueue(task)
    stats = agl.Runner(app, server.url, concurrency=1, heartbeat_s=0.5).run(max_rollouts=1)
    assert stats.succeeded == 1, stats
    detail = client.rollout_detail(rollout.id)
    detail.llm_calls.sort(key=lambda c: c.seq)
    return detail


def agents_of_calls(detail: RolloutDetail) -> list[str | None]:
    return [c.agent_name for c in detail.llm_calls]


def tool_spans(detail: RolloutDetail) -> list[Span]:
    return sorted((s for s in detail.spans if s.name.startswith("tool:")), key=lambda s: s.start_time)


def assert_exact_ids(detail: RolloutDetail) -> None:
    """Every call's prompt ids are those the scripted backend's tokenizer gives the request the agent sent (as
    the proxy forwarded it), and a text answer's response ids are its text's: exact token ids for training."""
    from agl.testing.upstream import encode, render_prompt

    for call in detail.llm_calls:
        assert call.prompt_ids == encode(render_prompt(call.request["messages"], call.request.get("tools"))), call.seq
        content = (call.response_message or {}).get("content")
        if isinstance(content, str) and not (call.response_message or {}).get("tool_calls"):
            assert call.response_ids == encode(content), call.seq
        assert call.logprobs is not None and len(call.logprobs) == len(call.response_ids or [])
