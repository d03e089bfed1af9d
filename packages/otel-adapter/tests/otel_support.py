"""Helpers for the agl_otel tests: the example apps, and one rollout run in this process against a real server."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from agl.client import Client
from agl.common import attributes as attr
from agl.common.processes import ServerProcess
from agl.schema import RolloutDetail, Span
from agl.testing.fixtures import wait_rollouts

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


def run_example(
    example: str,
    server: ServerProcess,
    client: Client,
    workers: Any,
    tasks: list[dict[str, Any]],
    *,
    statuses: list[str],
    max_attempts: int = 1,
    timeout: float = 120,
) -> list[RolloutDetail]:
    """Enqueue `tasks`, run them with `agl worker examples/<example>.py:solve`, check their final statuses; their
    stored details, calls in `seq` order."""
    ids = [r.id for task in tasks for r in client.enqueue(task, max_attempts=max_attempts)]
    workers(f"{EXAMPLES / example}.py:solve", server.url)
    assert [r.status.value for r in wait_rollouts(client, ids, timeout=timeout)] == statuses
    details = [client.rollout_detail(i) for i in ids]
    for detail in details:
        detail.llm_calls.sort(key=lambda c: c.seq)
    return details


def check_planner_and_solver(detail: RolloutDetail) -> None:
    """The two-agent examples' run: the planner calls the solver (a tool), the solver calls its calculator and
    answers, the planner answers. Each call is stored under the agent that sent it (its instructions are the
    request's system message), with exact token ids."""
    assert agents_of_calls(detail) == ["planner", "solver", "solver", "planner"]
    assert [str(c.request["messages"][0]["content"]).split(".")[0] for c in detail.llm_calls] == [
        "You are planner",
        "You are solver",
        "You are solver",
        "You are planner",
    ]
    assert all(c.trainable for c in detail.llm_calls)
    assert_exact_ids(detail)


def tools_seen(detail: RolloutDetail) -> list[tuple[str, str, str | None]]:
    """(tool, status, agent) of each tool span, sorted."""
    return sorted((str(s.attributes[attr.TOOL_NAME]), s.status.value, s.agent_name) for s in tool_spans(detail))
