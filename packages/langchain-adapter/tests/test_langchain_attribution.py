"""Each LLM call a LangChain / LangGraph run makes reaches the proxy with the name of the agent that made it.

Every test runs the real framework in an in-process `agl.Runner` against a real `agl serve` process and the
scripted upstream; the agent each stored call names is compared with the system prompt that call carried.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from lc_support import (
    EXAMPLE_AGENTS,
    SCRIPT,
    TASK,
    AsyncBarrier,
    SyncBarrier,
    agent_spans,
    async_team,
    calls,
    chat_model,
    load_example,
    parallel_graph,
    run_rollout,
    said,
    system_prompt,
    tool_spans,
)

import agl
from agl.client import Client
from agl.common.processes import ServerProcess
from agl.learn.transitions import build_episodes
from agl_langchain import AglCallbackHandler
from agl_langchain import handler as handler_module

example = load_example()


@pytest.fixture(autouse=True)
def no_run_left_open() -> Any:
    yield
    assert handler_module._runs == {}  # every run the handler opened was closed


def test_sync_invoke_names_each_node(agl_server: ServerProcess, agl_client: Client) -> None:
    detail = run_rollout(example.write_essay, agl_server, agl_client, TASK)
    stored = calls(detail)
    assert [c.agent_name for c in stored] == EXAMPLE_AGENTS
    assert all(c.attribution.value == "scope" and system_prompt(c) == SCRIPT[c.agent_name] for c in stored)
    assert [r.value for r in detail.rewards] == [1.0]
    # one agent span per node step, like `with agl.agent(...)`, for the trace view
    names = [s.agent_name for s in agent_spans(detail)]
    assert names == ["writer", "checker", "tools", "checker", "rewriter", "checker", "tools", "checker"]


@agl.rollout
async def async_team_app(task: Any, llm: agl.LLM) -> None:
    graph = async_team(chat_model(llm), [example.word_count])
    await graph.ainvoke({"messages": [HumanMessage("count these four words")]}, {"callbacks": [AglCallbackHandler()]})


def test_async_ainvoke_names_each_node(agl_server: ServerProcess, agl_client: Client) -> None:
    stored = calls(run_rollout(async_team_app, agl_server, agl_client))
    assert [c.agent_name for c in stored] == ["writer", "checker", "checker"]
    assert system_prompt(stored[0]) == said("writer")
    assert all(system_prompt(c).startswith("agl-tools: word_count") for c in stored[1:])
    assert stored[-1].response_message is not None and "checker saw 4" in str(stored[-1].response_message["content"])


@agl.rollout
def sync_stream_app(task: Any, llm: agl.LLM) -> None:
    graph = example.build_graph(chat_model(llm), SCRIPT)
    chunks = list(
        graph.stream(example.essay_input(TASK), {"callbacks": [AglCallbackHandler()]}, stream_mode="messages")
    )
    # LangGraph streams the model's tokens, tagged with the node that produced them
    assert {meta["langgraph_node"] for _, meta in chunks} >= {"writer", "checker", "rewriter"}


@agl.rollout
async def async_stream_app(task: Any, llm: agl.LLM) -> None:
    graph = async_team(chat_model(llm, streaming=True), [example.word_count])
    config = {"callbacks": [AglCallbackHandler()]}
    async for _ in graph.astream({"messages": [HumanMessage("two words")]}, config, stream_mode="messages"):
        pass


def test_stream_messages_calls_are_streamed_and_named(agl_server: ServerProcess, agl_client: Client) -> None:
    stored = calls(run_rollout(sync_stream_app, agl_server, agl_client))
    assert [c.agent_name for c in stored] == EXAMPLE_AGENTS
    assert all(c.stream and c.response_ids and system_prompt(c) == SCRIPT[c.agent_name] for c in stored)


def test_astream_messages_calls_are_streamed_and_named(agl_server: ServerProcess, agl_client: Client) -> None:
    stored = calls(run_rollout(async_stream_app, agl_server, agl_client))
    assert [c.agent_name for c in stored] == ["writer", "checker", "checker"]
    assert all(c.stream and c.response_ids and c.attribution.value == "scope" for c in stored)


@agl.rollout
def parallel_threads_app(task: Any, llm: agl.LLM) -> None:
    graph = parallel_graph(chat_model(llm), asynchronous=False)
    graph.invoke({"messages": [HumanMessage("go")]}, {"callbacks": [AglCallbackHandler(), SyncBarrier()]})


@agl.rollout
async def parallel_tasks_app(task: Any, llm: agl.LLM) -> None:
    graph = parallel_graph(chat_model(llm), asynchronous=True)
    await graph.ainvoke({"messages": [HumanMessage("go")]}, {"callbacks": [AglCallbackHandler(), AsyncBarrier()]})


@pytest.mark.parametrize("app", [parallel_threads_app, parallel_tasks_app], ids=["threads", "tasks"])
def test_parallel_branches_keep_their_own_names(app: Any, agl_server: ServerProcess, agl_client: Client) -> None:
    stored = calls(run_rollout(app, agl_server, agl_client))
    assert sorted(c.agent_name or "" for c in stored) == ["left", "left", "right", "right"]
    assert all(system_prompt(c) == said(c.agent_name or "") for c in stored)


@agl.rollout
async def plain_chain_app(task: Any, llm: agl.LLM) -> None:
    """LangChain without LangGraph: the outermost run's name, unless an `agl.agent` scope chose the agent."""
    model = chat_model(llm)
    handler = AglCallbackHandler()
    summarize = ChatPromptTemplate.from_messages([("system", said("summarizer")), ("user", "{text}")]) | model
    summarize.invoke({"text": "a"}, {"callbacks": [handler], "run_name": "summarizer"})
    await summarize.ainvoke({"text": "b"}, {"callbacks": [handler], "run_name": "summarizer"})
    # a model called on its own, twice in one task: the second call must not keep the first one's name
    await model.ainvoke(
        [SystemMessage(said("critic")), HumanMessage("c")], {"callbacks": [handler], "run_name": "critic"}
    )
    await model.ainvoke(
        [SystemMessage(said("judge")), HumanMessage("d")], {"callbacks": [handler], "run_name": "judge"}
    )
    model.invoke([SystemMessage(said("critic")), HumanMessage("e")], {"callbacks": [handler], "run_name": "critic"})
    with agl.agent("boss"):
        boss = ChatPromptTemplate.from_messages([("system", said("boss")), ("user", "{text}")]) | model
        await boss.ainvoke({"text": "f"}, {"callbacks": [handler], "run_name": "ignored"})
        # an explicit agent name in the metadata (what `create_agent(name=...)` sets) names any runnable
        editor = ChatPromptTemplate.from_messages([("system", said("editor")), ("user", "{text}")]) | model
        editor.with_config(metadata={"lc_agent_name": "editor"}).invoke({"text": "g"}, {"callbacks": [handler]})


def test_plain_chains_use_the_run_name_or_the_open_scope(agl_server: ServerProcess, agl_client: Client) -> None:
    stored = calls(run_rollout(plain_chain_app, agl_server, agl_client))
    assert [c.agent_name for c in stored] == ["summarizer", "summarizer", "critic", "judge", "critic", "boss", "editor"]
    assert all(system_prompt(c) == said(c.agent_name or "") for c in stored)


@agl.rollout
def named_agents_app(task: Any, llm: agl.LLM) -> None:
    """`create_agent(name=...)`: its nodes are all "model" and "tools"; the agent's own name identifies it, also
    for an agent that another agent calls from a tool."""
    model = chat_model(llm)
    helper = create_agent(model, tools=[example.word_count], system_prompt="agl-tools: word_count", name="helper")

    @tool
    def ask_helper(question: str) -> str:
        """Ask the helper agent."""
        return str(helper.invoke({"messages": [HumanMessage(question)]})["messages"][-1].text)

    boss = create_agent(model, tools=[ask_helper], system_prompt="agl-tools: ask_helper", name="supervisor")
    boss.invoke({"messages": [HumanMessage("how many words here")]}, {"callbacks": [AglCallbackHandler()]})


def test_named_create_agent_graphs_use_their_names(agl_server: ServerProcess, agl_client: Client) -> None:
    detail = run_rollout(named_agents_app, agl_server, agl_client)
    stored = calls(detail)
    assert [c.agent_name for c in stored] == ["supervisor", "helper", "helper", "supervisor"]
    assert [system_prompt(c) for c in stored] == ["agl-tools: ask_helper"] + ["agl-tools: word_count"] * 2 + [
        "agl-tools: ask_helper"
    ]
    assert [s.agent_name for s in agent_spans(detail)] == ["supervisor", "helper"]
    assert [(s.name, s.agent_name) for s in tool_spans(detail)] == [
        ("tool:ask_helper", "supervisor"),
        ("tool:word_count", "helper"),
    ]


@agl.rollout
def unnamed_agents_app(task: Any, llm: agl.LLM) -> float:
    """LangChain's tutorial shape: agents made without `name=`, one calling the other from a tool."""
    model = chat_model(llm)
    helper = create_agent(model, tools=[example.word_count], system_prompt="agl-tools: word_count")

    @tool
    def ask_helper(question: str) -> str:
        """Ask the helper agent."""
        return str(helper.invoke({"messages": [HumanMessage(question)]})["messages"][-1].text)

    boss = create_agent(model, tools=[ask_helper], system_prompt="agl-tools: ask_helper")
    boss.invoke({"messages": [HumanMessage("how many words here")]}, {"callbacks": [AglCallbackHandler()]})
    return 1.0


def test_unnamed_agents_collapse_into_model_and_the_worker_says_so_once_per_rollout(
    agl_server: ServerProcess, agl_client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING", logger="agl_langchain.handler")
    detail = run_rollout(unnamed_agents_app, agl_server, agl_client)
    assert [c.agent_name for c in calls(detail)] == ["model"] * 4  # two agents, one name: nothing to select by
    warnings = [r.getMessage() for r in caplog.records if "without a name" in r.getMessage()]
    assert len(warnings) == 1 and detail.rollout.id in warnings[0] and "name='writer'" in warnings[0]
    _, stats = build_episodes([detail])
    assert stats.generic_names == {"model": 4}


@agl.rollout
async def raw_client_app(task: Any, llm: agl.LLM) -> None:
    """Nodes that call the OpenAI SDK themselves (no LangChain model, so no model callbacks) are named by their
    node's own run: a sync node (run in a worker thread) and an async one."""
    sync_client, async_client = llm.openai_client(max_retries=0), llm.async_openai_client(max_retries=0)

    def planner(state: MessagesState) -> dict[str, Any]:
        messages = [{"role": "system", "content": said("planner")}, {"role": "user", "content": "plan"}]
        sync_client.chat.completions.create(model=llm.model, messages=messages)
        return {}

    async def solver(state: MessagesState) -> dict[str, Any]:
        messages = [{"role": "system", "content": said("solver")}, {"role": "user", "content": "solve"}]
        await async_client.chat.completions.create(model=llm.model, messages=messages, stream=True)
        return {}

    graph = StateGraph(MessagesState)
    graph.add_node("planner", planner)
    graph.add_node("solver", solver)
    graph.add_edge(START, "planner")
    graph.add_edge("planner", "solver")
    graph.add_edge("solver", END)
    await graph.compile().ainvoke({"messages": []}, {"callbacks": [AglCallbackHandler()]})


def test_raw_openai_clients_in_nodes_are_named_by_the_node(agl_server: ServerProcess, agl_client: Client) -> None:
    stored = calls(run_rollout(raw_client_app, agl_server, agl_client))
    assert [c.agent_name for c in stored] == ["planner", "solver"]
    assert all(system_prompt(c) == said(c.agent_name or "") for c in stored)
