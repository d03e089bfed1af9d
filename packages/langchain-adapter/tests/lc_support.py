"""Shared pieces of the adapter tests: the example app, scripted prompts, small graphs and a runner helper.

The scripted upstream answers from directives in the system prompt (see `agl.testing.upstream`), so each agent's
system prompt both scripts its answer and tells which agent sent a stored call.
"""

from __future__ import annotations

import asyncio
import collections
import importlib.util
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

from langchain_core.callbacks import AsyncCallbackHandler, BaseCallbackHandler
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, SystemMessage
from langchain_core.tools import BaseTool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition

import agl
from agl.client import Client
from agl.common.processes import ServerProcess
from agl.schema import LLMCall, RolloutDetail, Span

EXAMPLE_PATH = Path(__file__).resolve().parents[1] / "examples" / "writer_checker_rewriter.py"

# The example's prompts for the scripted model: the writer forgets the keyword, the checker counts words and
# always asks for a revision (so the rewriter runs once), the rewriter's text earns the full reward.
SCRIPT = {
    "writer": "agl-say: A first draft about the sea.",
    "checker": "agl-tools: word_count\nagl-say: REVISE ({tool} words): use the keyword.",
    "rewriter": "agl-say: The moon pulls the tides.",
}
TASK = {"topic": "tides", "keyword": "moon", "max_words": 20, "prompts": SCRIPT}
# writer, checker (asks for word_count), checker (verdict), rewriter, checker (tool), checker (verdict)
EXAMPLE_AGENTS = ["writer", "checker", "checker", "rewriter", "checker", "checker"]


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("writer_checker_rewriter", EXAMPLE_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def chat_model(llm: agl.LLM, **kwargs: Any) -> ChatOpenAI:
    return ChatOpenAI(base_url=llm.base_url, api_key=llm.api_key, model=llm.model, max_retries=0, **kwargs)


def run_rollout(
    app: Any, server: ServerProcess, client: Client, task: Any = "t", succeed: bool = True
) -> RolloutDetail:
    (rollout,) = client.enqueue(task)
    stats = agl.Runner(app, server.url, concurrency=1, heartbeat_s=0.5).run(max_rollouts=1)
    assert stats.succeeded == int(succeed), stats
    return client.rollout_detail(rollout.id)


def calls(detail: RolloutDetail) -> list[LLMCall]:
    return sorted(detail.llm_calls, key=lambda c: c.seq)


def system_prompt(call: LLMCall) -> str:
    first = call.request["messages"][0]
    assert first["role"] == "system"
    return str(first["content"])


def tool_spans(detail: RolloutDetail) -> list[Span]:
    return sorted((s for s in detail.spans if s.attributes.get("agl.span.kind") == "tool"), key=lambda s: s.start_time)


def agent_spans(detail: RolloutDetail) -> list[Span]:
    return sorted((s for s in detail.spans if s.attributes.get("agl.span.kind") == "agent"), key=lambda s: s.start_time)


def said(name: str) -> str:
    """A system prompt that scripts the answer and names the agent."""
    return f"agl-say: {name} speaking"


# ------------------------------------------------------------------------------------------- async team


def async_team(model: BaseChatModel, tools: list[BaseTool]) -> CompiledStateGraph:
    """writer → checker ⇄ tools, with async nodes (`ainvoke`); the checker calls each tool once."""
    names = ", ".join(t.name for t in tools)
    checker_model = model.bind_tools(tools)

    async def writer(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [await model.ainvoke([SystemMessage(said("writer")), *state["messages"]])]}

    async def checker(state: MessagesState) -> dict[str, list[BaseMessage]]:
        prompt = f"agl-tools: {names}\nagl-say: checker saw {{tool}}"
        return {"messages": [await checker_model.ainvoke([SystemMessage(prompt), *state["messages"]])]}

    graph = StateGraph(MessagesState)
    graph.add_node("writer", writer)
    graph.add_node("checker", checker)
    graph.add_node("tools", ToolNode(tools, handle_tool_errors=True))
    graph.add_edge(START, "writer")
    graph.add_edge("writer", "checker")
    graph.add_conditional_edges("checker", tools_condition, ["tools", END])
    graph.add_edge("tools", "checker")
    return graph.compile()


# -------------------------------------------------------------------------------------- parallel branches


class SyncBarrier(BaseCallbackHandler):
    """Holds each model call, after agl's handler saw it start and before its request leaves, until both
    parallel calls have started: a handler that kept one "current agent" for all would then name both alike."""

    run_inline = True

    def __init__(self, parties: int = 2) -> None:
        self.barrier = threading.Barrier(parties)

    def on_chat_model_start(self, *args: Any, **kwargs: Any) -> None:
        self.barrier.wait(10)


class AsyncBarrier(AsyncCallbackHandler):
    """`SyncBarrier` for asyncio tasks (awaited inline, in the task that makes the call)."""

    run_inline = True

    def __init__(self, parties: int = 2) -> None:
        self.parties, self.arrived, self.generation = parties, 0, 0
        self.released: dict[int, asyncio.Event] = collections.defaultdict(asyncio.Event)

    async def on_chat_model_start(self, *args: Any, **kwargs: Any) -> None:
        generation = self.generation
        self.arrived += 1
        if self.arrived == self.parties:
            self.arrived, self.generation = 0, generation + 1
            self.released[generation].set()
        await asyncio.wait_for(self.released[generation].wait(), 10)


def parallel_graph(model: BaseChatModel, *, asynchronous: bool, turns: int = 2) -> CompiledStateGraph:
    """left and right run at the same time, each making `turns` model calls."""

    def node(name: str) -> Any:
        def run(state: MessagesState) -> dict[str, list[BaseMessage]]:
            return {"messages": [model.invoke([SystemMessage(said(name)), *state["messages"]]) for _ in range(turns)]}

        async def arun(state: MessagesState) -> dict[str, list[BaseMessage]]:
            out = [await model.ainvoke([SystemMessage(said(name)), *state["messages"]]) for _ in range(turns)]
            return {"messages": out}

        return arun if asynchronous else run

    graph = StateGraph(MessagesState)
    for name in ("left", "right"):
        graph.add_node(name, node(name))
        graph.add_edge(START, name)
        graph.add_edge(name, END)
    return graph.compile()
