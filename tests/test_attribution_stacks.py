"""Attribution on every HTTP stack the frameworks use, and a loud, counted failure when a client bypasses it.

openai ≥ 3 sends its requests through `httpx2`, not `httpx`: a hook on `httpx` alone stored every call of such a
client without its agent name, and nothing said so. These tests run agents in an in-process `agl.Runner`
against a real `agl serve` and the scripted upstream: one whose raw `httpx2` clients must be attributed, and one
that sends with `urllib` (a client agl does not patch) inside agent scopes, whose calls must be marked as having
lost their agent name, counted by `agl show` and the transition builder, and warned about once per worker.
"""

from __future__ import annotations

import importlib
import json
import logging
import urllib.request
from typing import Any

import httpx
import pytest
from rich.console import Console

import agl
from agl.capture import runner as runner_module
from agl.capture.tracing import http_inject
from agl.cli.show import render_rollout
from agl.client import Client
from agl.common.processes import ServerProcess
from agl.learn.selection import AgentSelection
from agl.learn.transitions import BuildStats, build_episode
from agl.schema import Attribution, LLMCall


def _run(agent: Any, server: ServerProcess, client: Client, n: int = 1) -> list[list[LLMCall]]:
    rollouts = client.enqueue({"question": "q"}, n=n)
    stats = agl.Runner(agent, server.url, concurrency=1, heartbeat_s=0.5).run(max_rollouts=n)
    assert stats.succeeded == n, stats
    return [sorted(client.rollout_detail(r.id).llm_calls, key=lambda c: c.seq) for r in rollouts]


def _body(llm: agl.LLM, text: str) -> dict[str, Any]:
    return {"model": llm.model, "messages": [{"role": "user", "content": text}]}


httpx2 = pytest.importorskip("httpx2", reason="httpx2 (openai ≥ 3's HTTP stack) is part of the pinned test set")


@agl.rollout
async def httpx2_agent(task: Any, llm: agl.LLM) -> float:
    with httpx2.Client() as sync_client, agl.agent("planner"):
        sync_client.post(f"{llm.base_url}/chat/completions", json=_body(llm, "planner: plan")).raise_for_status()
    async with httpx2.AsyncClient() as async_client:
        with agl.agent("solver"):
            resp = await async_client.post(f"{llm.base_url}/chat/completions", json=_body(llm, "solver: go"))
            resp.raise_for_status()
        agl.emit_reward(0.5, name="after_solver")
    return 1.0


def test_httpx2_clients_carry_the_agent_and_position_rewards(server: ServerProcess, client: Client) -> None:
    (calls,) = _run(httpx2_agent, server, client)
    assert [(c.agent_name, c.attribution) for c in calls] == [
        ("planner", Attribution.scope),
        ("solver", Attribution.scope),
    ]
    # the proxy's sequence number came back through the httpx2 hook: the reward sits after the solver's call
    detail = client.rollout_detail(calls[0].rollout_id)
    (intermediate,) = [r for r in detail.rewards if r.name == "after_solver"]
    assert intermediate.after_llm_seq == calls[1].seq


def _urllib_post(llm: agl.LLM, text: str) -> None:
    request = urllib.request.Request(
        f"{llm.base_url}/chat/completions",
        data=json.dumps(_body(llm, text)).encode(),
        headers={"content-type": "application/json", "authorization": f"Bearer {llm.api_key}"},
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        assert resp.status == 200


@agl.rollout
def urllib_agent_in_scopes(task: Any, llm: agl.LLM) -> float:
    with agl.agent("solver"):
        _urllib_post(llm, "solver: unpatched")
        # the same scope through a patched client: still attributed, so one rollout shows both kinds
        with httpx.Client() as patched:
            patched.post(f"{llm.base_url}/chat/completions", json=_body(llm, "solver: patched")).raise_for_status()
    return 1.0


@agl.rollout
def urllib_agent_without_scopes(task: Any, llm: agl.LLM) -> float:
    _urllib_post(llm, "nobody: unpatched")
    return 1.0


def test_a_call_that_bypasses_the_hook_inside_a_scope_is_marked_counted_and_warned_once(
    server: ServerProcess, client: Client, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner_module, "_warned_missed", False)
    caplog.set_level(logging.WARNING, logger="agl.capture.runner")
    runs = _run(urllib_agent_in_scopes, server, client, n=2)
    for calls in runs:
        assert [(c.agent_name, c.attribution) for c in calls] == [
            (None, Attribution.missed),
            ("solver", Attribution.scope),
        ]
    warnings = [r.getMessage() for r in caplog.records if "without their agent name" in r.getMessage()]
    assert len(warnings) == 1, warnings  # one per worker, not one per rollout
    assert "HTTP client agl does not patch" in warnings[0] and "httpx" in warnings[0]

    detail = client.rollout_detail(runs[0][0].rollout_id)
    console = Console(width=250, record=True)
    console.print(render_rollout(detail))
    shown = console.export_text()
    assert "agent name lost" in shown and "1 lost their agent name" in shown

    # the transition builder counts it whatever the selection, and says why it drops it with one
    stats_all, stats_sel = BuildStats(), BuildStats()
    assert build_episode(detail, stats=stats_all) is not None
    assert stats_all.missed_attribution == 1 and "lost their agent name" in stats_all.summary()
    episode = build_episode(detail, AgentSelection.parse("solver"), stats=stats_sel)
    assert episode is not None and [t.agent_name for t in episode.transitions] == ["solver"]
    assert stats_sel.dropped_calls == {"agent name lost": 1}


def test_a_call_that_bypasses_the_hook_with_no_scope_opened_is_only_unattributed(
    server: ServerProcess, client: Client, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner_module, "_warned_missed", False)
    caplog.set_level(logging.WARNING, logger="agl.capture.runner")
    ((call,),) = _run(urllib_agent_without_scopes, server, client)
    assert call.agent_name is None and call.attribution is Attribution.unhooked
    assert not call.attribution.lost
    assert not [r for r in caplog.records if "without their agent name" in r.getMessage()]


def test_install_patches_every_installed_stack_and_uninstall_restores_them() -> None:
    stacks = {name: importlib.import_module(name) for name in ("httpx", "httpx2")}
    http_inject.uninstall()
    before = {(n, c): getattr(m, c).send for n, m in stacks.items() for c in ("Client", "AsyncClient")}
    try:
        http_inject.install()
        http_inject.install()  # idempotent: wrapped once
        assert http_inject.patched_stacks() == ["httpx", "httpx2"]
        for (name, cls), original in before.items():
            patched = getattr(stacks[name], cls).send
            assert patched is not original and patched.__agl_original__ is original, (name, cls)
    finally:
        http_inject.uninstall()
    assert {(n, c): getattr(m, c).send for n, m in stacks.items() for c in ("Client", "AsyncClient")} == before
    assert not http_inject.installed() and http_inject.patched_stacks() == []
