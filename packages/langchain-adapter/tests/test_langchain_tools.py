"""Tool runs become tool spans with status ok / error, including errors LangChain or LangGraph turn into messages.

The scripted model calls the tools its system prompt lists (`agl-tools: ...`), each once, then answers.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import BaseTool, ToolException, tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from lc_support import TASK, calls, chat_model, load_example, run_rollout, tool_spans

import agl
from agl.client import Client
from agl.common.processes import ServerProcess
from agl.learn.air import ToolStatusRule
from agl.schema import RolloutDetail, SpanStatus
from agl_langchain import AglCallbackHandler

example = load_example()


@tool
def word_count(text: str) -> int:
    """Count the words in a text."""
    return len(text.split())


@tool
def broken(text: str) -> str:
    """Always fails."""
    raise ValueError(f"cannot handle {len(text)} characters")


@tool
def picky(text: str) -> str:
    """Fails with a ToolException, which the tool itself turns into its answer (`handle_tool_error`)."""
    raise ToolException("picky refuses")


picky.handle_tool_error = True


@tool
def ghost(text: str) -> str:
    """Offered to the model but missing from the ToolNode: a made-up tool, as far as the graph knows."""
    return "never runs"


def tool_graph(
    model: BaseChatModel,
    offered: list[BaseTool],
    runnable: list[BaseTool],
    *,
    handle_tool_errors: bool = True,
    asynchronous: bool = False,
) -> CompiledStateGraph:
    """caller ⇄ tools: the caller calls each offered tool once, then says what the last tool returned."""
    bound = model.bind_tools(offered)
    prompt = SystemMessage(f"agl-tools: {', '.join(t.name for t in offered)}\nagl-say: done: {{tool}}")

    def caller(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [bound.invoke([prompt, *state["messages"]])]}

    async def acaller(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [await bound.ainvoke([prompt, *state["messages"]])]}

    graph = StateGraph(MessagesState)
    graph.add_node("caller", acaller if asynchronous else caller)
    graph.add_node("tools", ToolNode(runnable, handle_tool_errors=handle_tool_errors))
    graph.add_edge(START, "caller")
    graph.add_conditional_edges("caller", tools_condition, ["tools", END])
    graph.add_edge("tools", "caller")
    return graph.compile()


def requested_call_ids(detail: RolloutDetail) -> list[str]:
    """The tool call ids the model produced, in order, as the proxy stored them."""
    return [
        str(call["id"])
        for c in calls(detail)
        for call in (c.response_message or {}).get("tool_calls") or []  # type: ignore[union-attr]
    ]


def test_successful_tools_have_ok_spans_tied_to_the_model_call(agl_server: ServerProcess, agl_client: Client) -> None:
    detail = run_rollout(example.write_essay, agl_server, agl_client, TASK)
    spans = tool_spans(detail)
    assert [s.name for s in spans] == ["tool:word_count", "tool:word_count"]
    # run by the "tools" node, asked for by the checker: the span names the agent that asked
    assert all(s.status is SpanStatus.ok and s.agent_name == "checker" for s in spans)
    assert [s.attributes["gen_ai.tool.call.id"] for s in spans] == requested_call_ids(detail)
    # the tool really ran on what the model asked: its result is the number of words it was given
    for span in spans:
        text = json.loads(span.attributes["agl.tool.arguments"])["text"]
        assert span.attributes["agl.tool.result"] == str(len(text.split()))
    # and each is placed after the LLM call that asked for it (AIR rewards land there)
    asked = [c.seq for c in calls(detail) if (c.response_message or {}).get("tool_calls")]
    assert [s.attributes["agl.after_llm_seq"] for s in spans] == asked


def make_app(offered: list[BaseTool], runnable: list[BaseTool], **options: Any) -> Any:
    if options.get("asynchronous"):

        async def arun(task: Any, llm: agl.LLM) -> None:
            graph = tool_graph(chat_model(llm), offered, runnable, **options)
            await graph.ainvoke({"messages": [HumanMessage("ten words")]}, {"callbacks": [AglCallbackHandler()]})

        return agl.rollout(arun)

    def run(task: Any, llm: agl.LLM) -> None:
        graph = tool_graph(chat_model(llm), offered, runnable, **options)
        graph.invoke({"messages": [HumanMessage("ten words")]}, {"callbacks": [AglCallbackHandler()]})

    return agl.rollout(run)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_tool_error_the_toolnode_catches_is_an_error_span(
    asynchronous: bool, agl_server: ServerProcess, agl_client: Client
) -> None:
    app = make_app([word_count, broken], [word_count, broken], asynchronous=asynchronous)
    detail = run_rollout(app, agl_server, agl_client)
    ok, failed = tool_spans(detail)
    assert (ok.name, ok.status, failed.name, failed.status) == (
        "tool:word_count",
        SpanStatus.ok,
        "tool:broken",
        SpanStatus.error,
    )
    assert failed.status_message == "ValueError: cannot handle 9 characters"
    assert ok.agent_name == failed.agent_name == "caller"
    assert [s.attributes["gen_ai.tool.call.id"] for s in (ok, failed)] == requested_call_ids(detail)
    # the graph went on: the model saw the error as the tool's answer
    last_request = calls(detail)[-1].request["messages"]
    assert last_request[-1]["role"] == "tool" and "cannot handle" in last_request[-1]["content"]
    # AIR turns the error span into a negative reward after the call that asked for the tool
    (reward,) = ToolStatusRule()(detail)
    assert reward.value == -0.1 and reward.after_llm_seq == calls(detail)[1].seq


def test_errors_turned_into_tool_messages_are_error_spans(agl_server: ServerProcess, agl_client: Client) -> None:
    """`handle_tool_error` on the tool (it reports a normal end) and a tool name the ToolNode does not know (no
    tool runs at all): only a `ToolMessage(status="error")` says so."""
    detail = run_rollout(make_app([picky, ghost, word_count], [picky, word_count]), agl_server, agl_client)
    spans = {s.name: s for s in tool_spans(detail)}
    assert set(spans) == {"tool:picky", "tool:ghost", "tool:word_count"}
    assert spans["tool:picky"].status is SpanStatus.error and spans["tool:picky"].status_message == "picky refuses"
    assert spans["tool:ghost"].status is SpanStatus.error
    assert "ghost is not a valid tool" in (spans["tool:ghost"].status_message or "")
    assert all(s.agent_name == "caller" for s in spans.values())
    assert spans["tool:word_count"].status is SpanStatus.ok
    assert sorted(str(s.attributes["gen_ai.tool.call.id"]) for s in spans.values()) == sorted(
        requested_call_ids(detail)
    )


def test_a_tool_error_that_ends_the_run_is_an_error_span(agl_server: ServerProcess, agl_client: Client) -> None:
    """With `handle_tool_errors=False` the error escapes the graph and fails the rollout; the span is kept."""
    app = make_app([broken], [broken], handle_tool_errors=False)
    detail = run_rollout(app, agl_server, agl_client, succeed=False)
    (span,) = tool_spans(detail)
    assert span.status is SpanStatus.error and span.status_message == "ValueError: cannot handle 9 characters"


@agl.rollout
def history_app(task: Any, llm: agl.LLM) -> None:
    """The tool graph as a subgraph node: the node's output is the whole conversation, history included."""
    inner = tool_graph(chat_model(llm), [word_count], [word_count])
    outer = StateGraph(MessagesState)
    outer.add_node("inner", inner)
    outer.add_edge(START, "inner")
    outer.add_edge("inner", END)
    history = [
        HumanMessage("earlier"),
        AIMessage("", tool_calls=[{"name": "broken", "args": {"text": "x"}, "id": "old-call"}]),
        ToolMessage("ValueError: old failure", tool_call_id="old-call", name="broken", status="error"),
        HumanMessage("ten words"),
    ]
    outer.compile().invoke({"messages": history}, {"callbacks": [AglCallbackHandler()]})


def test_error_messages_already_in_the_input_are_not_new_errors(agl_server: ServerProcess, agl_client: Client) -> None:
    detail = run_rollout(history_app, agl_server, agl_client)
    assert [(s.name, s.status) for s in tool_spans(detail)] == [("tool:word_count", SpanStatus.ok)]
