"""Agent scopes attribute LLM calls through the proxy, in sync, async, threaded and streaming code.

Each agent below runs in an in-process `agl.Runner` against a real `agl serve` process and a scripted upstream;
the agent names the proxy stored are compared with the scope each call was made in. Concurrent calls from
different scopes are interleaved on purpose, so a shared (global) "current agent" would mix them up.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai

import agl
from agl.client import Client
from agl.common.processes import ServerProcess
from agl.schema import LLMCall


def run_one(agent: Any, server: ServerProcess, client: Client, task: Any = "t") -> list[LLMCall]:
    (rollout,) = client.enqueue(task)
    stats = agl.Runner(agent, server.url, concurrency=1, heartbeat_s=0.5).run(max_rollouts=1)
    assert stats.succeeded == 1, stats
    detail = client.rollout_detail(rollout.id)
    assert detail.rollout.status.value == "succeeded"
    return sorted(detail.llm_calls, key=lambda c: c.seq)


def said_by(call: LLMCall) -> str:
    """The agent a call claims to come from: the scripted upstream echoes the user message."""
    return call.request["messages"][-1]["content"].split(":")[0]


@agl.rollout
def sync_agent(task: Any, llm: agl.LLM) -> None:
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    for name in ("writer", "checker", "writer"):
        with agl.agent(name):
            client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": f"{name}: go"}])
    with agl.agent("outer"), agl.agent("inner"):  # the innermost scope wins
        client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": "inner: nested"}])


def test_sync_scopes_attribute_each_call(server: ServerProcess, client: Client) -> None:
    calls = run_one(sync_agent, server, client)
    assert [c.agent_name for c in calls] == ["writer", "checker", "writer", "inner"]
    assert all(c.attribution.value == "scope" for c in calls)


@agl.rollout
async def async_agent(task: Any, llm: agl.LLM) -> None:
    client = openai.AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)

    async def act(name: str, turns: int) -> None:
        with agl.agent(name):
            for i in range(turns):
                await client.chat.completions.create(
                    model=llm.model, messages=[{"role": "user", "content": f"{name}: turn {i}"}]
                )
                await asyncio.sleep(0)  # let the other agents' requests interleave with this one's

    await asyncio.gather(act("alpha", 4), act("beta", 4), act("gamma", 4))


def test_async_tasks_keep_their_own_scope(server: ServerProcess, client: Client) -> None:
    calls = run_one(async_agent, server, client)
    assert len(calls) == 12
    assert all(c.agent_name == said_by(c) for c in calls), [(c.agent_name, said_by(c)) for c in calls]
    assert Counter(c.agent_name for c in calls) == {"alpha": 4, "beta": 4, "gamma": 4}


@agl.rollout
def threaded_agent(task: Any, llm: agl.LLM) -> None:
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    barrier = threading.Barrier(3)

    def act(name: str) -> None:
        with agl.agent(name):
            barrier.wait(10)  # all three threads are inside their scopes at the same time
            for i in range(3):
                client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": f"{name}: {i}"}])

    with ThreadPoolExecutor(3) as pool:
        list(pool.map(agl.propagate(act), ["red", "green", "blue"]))

    # A thread started by hand does not inherit the rollout (Python's rule): its call reaches the proxy
    # without a name, and must be stored as unattributed, not given some other agent's name.
    def bare() -> None:
        client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": "nobody: bare"}])

    with agl.agent("red"):
        thread = threading.Thread(target=bare)
        thread.start()
        thread.join()


def test_threads_keep_their_own_scope_and_unknown_calls_are_flagged(server: ServerProcess, client: Client) -> None:
    calls = run_one(threaded_agent, server, client)
    named = [c for c in calls if said_by(c) != "nobody"]
    assert len(named) == 9
    assert all(c.agent_name == said_by(c) and c.attribution.value == "scope" for c in named)
    (bare,) = [c for c in calls if said_by(c) == "nobody"]
    assert bare.agent_name is None and bare.attribution.value == "unattributed"


@agl.rollout
async def streaming_agent(task: Any, llm: agl.LLM) -> None:
    client = openai.AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)

    async def open_stream(name: str) -> Any:
        with agl.agent(name):
            return await client.chat.completions.create(
                model=llm.model, messages=[{"role": "user", "content": f"{name}: tell me a long story"}], stream=True
            )

    # Both streams are opened in their scopes, then read interleaved after the scopes closed: the name is
    # fixed when the request leaves, not when its chunks arrive.
    first, second = await open_stream("narrator"), await open_stream("critic")
    parts: dict[str, list[str]] = {"narrator": [], "critic": []}
    iters = {"narrator": first.__aiter__(), "critic": second.__aiter__()}
    while iters:
        for name, it in list(iters.items()):
            try:
                chunk = await it.__anext__()
            except StopAsyncIteration:
                del iters[name]
                continue
            if chunk.choices and chunk.choices[0].delta.content:
                parts[name].append(chunk.choices[0].delta.content)
    sync_client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    with agl.agent("summarizer"):
        stream = sync_client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": "summarizer: done"}], stream=True
        )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text and all(parts.values())


def test_streaming_calls_are_attributed_to_the_scope_they_were_opened_in(server: ServerProcess, client: Client) -> None:
    calls = run_one(streaming_agent, server, client)
    assert sorted(c.agent_name or "" for c in calls) == ["critic", "narrator", "summarizer"]
    assert all(c.stream and c.agent_name == said_by(c) for c in calls)
    assert all(c.response_ids and c.trainable for c in calls)


@agl.rollout
def unscoped_agent(task: Any, llm: agl.LLM) -> None:
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": "nobody: hello"}])


def test_call_outside_any_scope_is_stored_and_flagged(server: ServerProcess, client: Client) -> None:
    (call,) = run_one(unscoped_agent, server, client)
    assert call.agent_name is None and call.attribution.value == "unattributed"
    assert call.prompt_ids and call.response_ids  # still stored in full


@agl.rollout
async def shared_client_agent(task: Any, llm: agl.LLM) -> None:
    """Uses the per-process shared clients; several rollouts run at once in one runner."""
    me = agl.current_rollout().rollout_id
    async_client = llm.async_openai_client(max_retries=0)
    sync_client = llm.openai_client(max_retries=0)
    for name in ("alpha", "beta"):
        with agl.agent(name):
            await async_client.chat.completions.create(
                model=llm.model, messages=[{"role": "user", "content": f"{name}: {me}"}]
            )
            await asyncio.sleep(0)  # let the other rollouts' calls interleave
    with agl.agent("gamma"):
        await asyncio.to_thread(
            agl.propagate(sync_client.chat.completions.create),
            model=llm.model,
            messages=[{"role": "user", "content": f"gamma: {me}"}],
        )


def test_shared_clients_send_each_rollouts_calls_to_its_own_url(server: ServerProcess, client: Client) -> None:
    rollouts = [r for _ in range(4) for r in client.enqueue("t")]
    stats = agl.Runner(shared_client_agent, server.url, concurrency=4, heartbeat_s=0.5).run(max_rollouts=4)
    assert stats.succeeded == 4, stats
    for rollout in rollouts:
        calls = client.rollout_detail(rollout.id).llm_calls
        assert sorted(c.agent_name or "" for c in calls) == ["alpha", "beta", "gamma"]
        for call in calls:
            name, sender = call.request["messages"][-1]["content"].split(": ")
            assert (call.agent_name, sender) == (name, rollout.id)


def test_per_agent_model_versions_route_each_agents_calls_to_its_own_backend_model(
    server: ServerProcess, client: Client
) -> None:
    from agl.schema import ModelVersionIn

    mv = client.publish_model_version(
        ModelVersionIn(name="step-1", upstream_model="base", agent_models={"writer": "policy-writer"})
    )
    calls = run_one(sync_agent, server, client)
    routed = [(c.agent_name, c.model_requested, c.model, c.model_version) for c in calls]
    assert routed == [
        ("writer", "agl-policy", "policy-writer", mv.version),
        ("checker", "agl-policy", "base", mv.version),
        ("writer", "agl-policy", "policy-writer", mv.version),
        ("inner", "agl-policy", "base", mv.version),
    ]


@agl.rollout
def unicode_agent(task: Any, llm: agl.LLM) -> None:
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    for name in ("Rédacteur", "研究员 lead", "50% done"):
        with agl.agent(name):
            client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": "go"}])


def test_agent_names_beyond_ascii_travel_intact(server: ServerProcess, client: Client) -> None:
    calls = run_one(unicode_agent, server, client)
    assert [c.agent_name for c in calls] == ["Rédacteur", "研究员 lead", "50% done"]
