"""The Spider agent: a LangGraph graph that writes SQL, runs it, checks it and rewrites it (as in the Agent
Lightning paper), traced for agl by `agl_langchain.with_agl`.

    writer ──▶ execute ──▶ checker ──CORRECT──▶ END
                  ▲   └─ turns used up ─▶ END
                  │            │ WRONG
                  └─ rewriter ◀┘

`writer` writes a query from the question and the schema; `execute` runs it on the read-only database and
records the run as an `execute_sql` tool span (status `error` when it fails or times out: AIR penalises it);
`checker` reads the question, the query and its (truncated) result or error and answers CORRECT or WRONG;
`rewriter` writes a corrected query from all of that and the review. A turn is one query written; after
`max_turns` queries the last one is final. The reward is the execution accuracy of the final query.

Task input: `{id, db_id, question, query (gold), db_path, schema}` from `agl_bench.spider.data`, plus optional:
- `max_turns` (int, default 3): queries written at most (the writer's and the rewrites);
- `timeout_s` (float, default 5): time limit of each query run, in seconds;
- `max_tokens` (int, default 200): answer length limit of every LLM call;
- `prompts` (dict with any of `writer`, `checker`, `rewriter`): system prompts replacing the defaults.
"""

from __future__ import annotations

import re
import time
from typing import Any, TypedDict

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from pydantic import SecretStr

import agl
from agl_bench.results import report
from agl_bench.spider.air import SQL_TOOL
from agl_bench.spider.evaluate import DEFAULT_TIMEOUT_S, QueryResult, execution_accuracy, extract_sql, run_query
from agl_langchain import with_agl

DEFAULT_MAX_TURNS = 3
DEFAULT_MAX_TOKENS = 200
_RESULT_ROWS = 5
_RESULT_CHARS = 600


class Prompts(TypedDict):
    writer: str
    checker: str
    rewriter: str


DEFAULT_PROMPTS = Prompts(
    writer=(
        "You write SQLite queries. Read the database schema and the question, then answer with one SQL query "
        "in a ```sql code block and nothing else."
    ),
    checker=(
        "You check SQLite queries. Read the question, the query and what it returned. If the query answers the "
        "question, answer CORRECT. Otherwise answer WRONG and say in one sentence what is wrong."
    ),
    rewriter=(
        "You fix SQLite queries. Read the schema, the question, the query, what it returned and the review, then "
        "answer with one corrected SQL query in a ```sql code block and nothing else."
    ),
)


class SqlState(TypedDict):
    question: str
    schema: str
    db_path: str
    timeout_s: float
    max_turns: int
    sql: str | None  # the query being worked on (None: the last answer held no SQL)
    author: str  # the agent that wrote it
    result: str  # what running it gave, as shown to the model
    review: str
    correct: bool
    turns: int


def format_result(result: QueryResult) -> str:
    """A query's result as the checker and rewriter see it: the first rows, the row count, or the error."""
    if result.error is not None:
        return f"Error: {result.error}"
    lines = [" | ".join(result.columns)]
    lines += [" | ".join(str(v) for v in row) for row in result.rows[:_RESULT_ROWS]]
    if len(result.rows) > _RESULT_ROWS:
        lines.append("...")
    lines.append(f"({len(result.rows)} rows)")
    text = "\n".join(lines)
    return text if len(text) <= _RESULT_CHARS else text[: _RESULT_CHARS - 4] + " ..."


_VERDICT = re.compile(r"\b(not\s+correct|incorrect|wrong|correct)\b", re.I)


def parse_verdict(review: str) -> bool:
    """True when the checker's first verdict word is CORRECT (not "incorrect", "not correct" or "wrong")."""
    match = _VERDICT.search(review)
    return match is not None and match.group(1).lower() == "correct"


def _query_text(state: SqlState) -> str:
    return (
        f"Database schema:\n{state['schema']}\n\nQuestion: {state['question']}\n\n"
        f"SQL query:\n{state['sql'] or '(none)'}\n\nResult:\n{state['result']}"
    )


def build_graph(model: BaseChatModel, prompts: Prompts = DEFAULT_PROMPTS) -> CompiledStateGraph[Any]:
    def writer(state: SqlState) -> dict[str, Any]:
        request = f"Database schema:\n{state['schema']}\n\nQuestion: {state['question']}"
        answer = model.invoke([SystemMessage(prompts["writer"]), HumanMessage(request)]).text
        return {"sql": extract_sql(answer), "author": "writer", "turns": state["turns"] + 1}

    def execute(state: SqlState) -> dict[str, Any]:
        sql = state["sql"]
        if sql is None:  # nothing ran: the no-SQL AIR rule, not the tool rule, judges such an answer
            return {"result": "Error: the answer holds no SQL query."}
        start = time.time()
        result = run_query(state["db_path"], sql, timeout_s=state["timeout_s"])
        shown = format_result(result)
        # The span is attributed to the agent that wrote the query (not to this node), so a failed query is charged
        # to the writer or rewriter; AIR places its reward right after that agent's LLM call.
        agl.record_tool(
            SQL_TOOL,
            start_time=start,
            error=result.error,
            arguments=sql,
            result=shown,
            agent_name=state["author"],
        )
        return {"result": shown}

    def checker(state: SqlState) -> dict[str, Any]:
        review = model.invoke([SystemMessage(prompts["checker"]), HumanMessage(_query_text(state))]).text
        return {"review": review, "correct": parse_verdict(review)}

    def rewriter(state: SqlState) -> dict[str, Any]:
        request = f"{_query_text(state)}\n\nReview:\n{state['review']}"
        answer = model.invoke([SystemMessage(prompts["rewriter"]), HumanMessage(request)]).text
        return {"sql": extract_sql(answer), "author": "rewriter", "turns": state["turns"] + 1}

    def after_execute(state: SqlState) -> str:
        return END if state["turns"] >= state["max_turns"] else "checker"

    def after_check(state: SqlState) -> str:
        return END if state["correct"] else "rewriter"

    graph = StateGraph(SqlState)
    graph.add_node("writer", writer)
    graph.add_node("execute", execute)
    graph.add_node("checker", checker)
    graph.add_node("rewriter", rewriter)
    graph.add_edge(START, "writer")
    graph.add_edge("writer", "execute")
    graph.add_conditional_edges("execute", after_execute, ["checker", END])
    graph.add_conditional_edges("checker", after_check, ["rewriter", END])
    graph.add_edge("rewriter", "execute")
    return graph.compile()


def initial_state(task: dict[str, Any]) -> SqlState:
    return SqlState(
        question=task["question"],
        schema=task["schema"],
        db_path=task["db_path"],
        timeout_s=float(task.get("timeout_s", DEFAULT_TIMEOUT_S)),
        max_turns=max(1, int(task.get("max_turns", DEFAULT_MAX_TURNS))),
        sql=None,
        author="writer",
        result="",
        review="",
        correct=False,
        turns=0,
    )


@agl.rollout
def solve(task: dict[str, Any], llm: agl.LLM) -> float:
    """Answer one Spider question; the reward is the execution accuracy of the final query (0 or 1)."""
    model = ChatOpenAI(
        model=llm.model,
        base_url=llm.base_url,
        api_key=SecretStr(llm.api_key),
        # `max_tokens` under its alias (the name type checkers know); the request carries `max_completion_tokens`
        max_completion_tokens=int(task.get("max_tokens", DEFAULT_MAX_TOKENS)),
    )
    prompts = Prompts(**{**DEFAULT_PROMPTS, **task.get("prompts", {})})
    state = initial_state(task)
    final = with_agl(build_graph(model, prompts)).invoke(state)
    sql: str | None = final["sql"]
    outcome = execution_accuracy(task["db_path"], task["query"], sql, timeout_s=state["timeout_s"])
    report(
        {
            "execution_accuracy": outcome.score,
            "turns": float(final["turns"]),
            "executable": float(outcome.executable),
        },
        prediction=sql or "",
        gold=task["query"],
        id=task.get("id"),
        db_id=task.get("db_id"),
        error=outcome.error,
        checker_accepted=final["correct"],
    )
    return outcome.score
