"""A LangGraph essay team: a writer drafts, a checker reviews (counting words with a tool), a rewriter revises.

    writer ──▶ checker ◀──▶ tools (word_count)
                  │ ▲
       APPROVED / │ │ REVISE
       limit hit  ▼ │
          END    rewriter

Everything here is ordinary LangChain / LangGraph code; the two lines marked `# agl` make it trainable:
`@agl.rollout` lets `agl worker` run it, and the callback handler tells agl which node made each LLM call and
records the tool runs. Run it with

    agl worker packages/langchain-adapter/examples/writer_checker_rewriter.py:write_essay --server URL

and train only the writer and the rewriter (the checker still runs, and its calls are still stored) with
`AGL_TRAIN_AGENTS=writer,rewriter`.
"""

from __future__ import annotations

from typing import Any, TypedDict

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, RemoveMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.message import REMOVE_ALL_MESSAGES
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode

import agl
from agl_langchain import AglCallbackHandler


class Prompts(TypedDict):
    writer: str
    checker: str
    rewriter: str


DEFAULT_PROMPTS = Prompts(
    writer="You are a writer. Write one short paragraph on the topic, following the rules you are given.",
    checker=(
        "You review drafts. Count the draft's words with the word_count tool, then answer APPROVED if the draft "
        "follows every rule, else REVISE followed by what to change."
    ),
    rewriter="You are an editor. Rewrite the draft so that it follows the review. Answer with the new draft only.",
)


class Essay(MessagesState):
    """`messages` holds the checker's review of the current draft (cleared for each new draft)."""

    topic: str
    rules: str
    draft: str
    rewrites: int


@tool
def word_count(text: str) -> int:
    """Count the words in a text."""
    return len(text.split())


def _review_request(state: Essay, draft: str) -> list[BaseMessage]:
    return [RemoveMessage(id=REMOVE_ALL_MESSAGES), HumanMessage(f"Rules: {state['rules']}\nDraft:\n{draft}")]


def build_graph(model: BaseChatModel, prompts: Prompts = DEFAULT_PROMPTS, max_rewrites: int = 1) -> CompiledStateGraph:
    checker_model = model.bind_tools([word_count])

    def writer(state: Essay) -> dict[str, Any]:
        request = f"Topic: {state['topic']}\nRules: {state['rules']}"
        draft = model.invoke([SystemMessage(prompts["writer"]), HumanMessage(request)]).text
        return {"draft": draft, "messages": _review_request(state, draft)}

    def checker(state: Essay) -> dict[str, Any]:
        return {"messages": [checker_model.invoke([SystemMessage(prompts["checker"]), *state["messages"]])]}

    def rewriter(state: Essay) -> dict[str, Any]:
        request = f"Rules: {state['rules']}\nDraft:\n{state['draft']}\nReview:\n{state['messages'][-1].text}"
        draft = model.invoke([SystemMessage(prompts["rewriter"]), HumanMessage(request)]).text
        return {"draft": draft, "rewrites": state["rewrites"] + 1, "messages": _review_request(state, draft)}

    def after_check(state: Essay) -> str:
        review = state["messages"][-1]
        if isinstance(review, AIMessage) and review.tool_calls:
            return "tools"
        if "APPROVED" in review.text.upper() or state["rewrites"] >= max_rewrites:
            return END
        return "rewriter"

    graph = StateGraph(Essay)
    graph.add_node("writer", writer)
    graph.add_node("checker", checker)
    graph.add_node("tools", ToolNode([word_count], handle_tool_errors=True))
    graph.add_node("rewriter", rewriter)
    graph.add_edge(START, "writer")
    graph.add_edge("writer", "checker")
    graph.add_conditional_edges("checker", after_check, ["tools", "rewriter", END])
    graph.add_edge("tools", "checker")
    graph.add_edge("rewriter", "checker")
    return graph.compile()


def essay_input(task: dict[str, Any]) -> Essay:
    rules = f"use the word '{task['keyword']}'; at most {task['max_words']} words"
    return Essay(messages=[], topic=task["topic"], rules=rules, draft="", rewrites=0)


def score(draft: str, task: dict[str, Any]) -> float:
    """1 when the final text uses the keyword within the word limit, 0.5 for one of the two, else 0."""
    uses_keyword = task["keyword"].lower() in draft.lower()
    short_enough = 0 < len(draft.split()) <= task["max_words"]
    return (float(uses_keyword) + float(short_enough)) / 2


@agl.rollout  # agl
def write_essay(task: dict[str, Any], llm: agl.LLM) -> float:
    """A task is `{"topic", "keyword", "max_words"}`, optionally with `"prompts"` overriding some of the
    instructions (a data set may vary them per task; the tests use it to script a fake model)."""
    model = ChatOpenAI(base_url=llm.base_url, api_key=llm.api_key, model=llm.model)
    graph = build_graph(model, Prompts(**{**DEFAULT_PROMPTS, **task.get("prompts", {})}))
    final = graph.invoke(essay_input(task), config={"callbacks": [AglCallbackHandler()]})  # agl
    return score(final["draft"], task)
