"""The MuSiQue agent: an OpenAI Agents SDK `researcher` that searches the paragraph corpus with a `retrieve` tool
and answers in one line `Answer: <short answer>` (the RAG task of the Agent Lightning paper).

    agl worker agl_bench.musique.agent:solve --server http://127.0.0.1:8000

Task input: `{id, question, answers, corpus_path, hops}` (see `data.py`) and these optional keys:

- `top_k` (int, default 3): passages per search;
- `retriever` (`"bm25"` default, or `"dense"`), with `embedding_url` (an OpenAI-compatible base URL ending in
  `/v1`) and `embedding_model` for dense retrieval (see `retrieval.py`);
- `max_turns` (int, default 4): model turns before the run is cut off; a run cut off answers "" (score 0);
- `prompts` (`{"researcher": ...}`): replaces the agent's instructions (tests put scripted-model directives here);
- `shots` (int, default 1): worked exchanges (question → retrieve call → passages → `Answer:`) shown before the
  question, as real tool calls in the conversation.

Reward: token F1 of the answer against the gold answer and its aliases. `report` stores `f1`, `em` and
`retrievals` (searches made). Every search is also recorded as a `musique:retrieval` span (hits, passage ids);
one with no hits has status `error`, which `air.EmptyRetrievalRule` penalises.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from typing import Any

from agents import (
    Agent,
    FunctionTool,
    MaxTurnsExceeded,
    ModelSettings,
    OpenAIChatCompletionsModel,
    RunConfig,
    Runner,
    function_tool,
)
from openai import AsyncOpenAI

import agl
import agl_openai_agents
from agl_bench.musique.air import (
    AGENT,
    ATTR_HITS,
    ATTR_PASSAGES,
    ATTR_QUERY,
    ATTR_RETRIEVER,
    RETRIEVAL_KIND,
    RETRIEVAL_SPAN,
)
from agl_bench.musique.evaluate import extract_answer, score
from agl_bench.musique.retrieval import Retriever, format_passages, get_retriever
from agl_bench.results import report

RESEARCHER_INSTRUCTIONS = (
    "You answer questions using Wikipedia passages. Call the retrieve tool with a short search query, one fact at "
    "a time; search at most 3 times. Then reply with one line: Answer: <a few words>"
)
NO_PASSAGES = "No passages found for this query. Try other words."
# A made-up worked exchange (not from MuSiQue) put in the conversation before the question: told only in words,
# SmolLM2-135M never calls the tool and never uses the answer format (0 searches on 10 dev questions).
WORKED = [
    (
        "In which country is the city where the Eiffel Tower stands?",
        "Eiffel Tower city",
        "[1] Eiffel Tower: The Eiffel Tower is a wrought-iron lattice tower in Paris, France.",
        "France",
    ),
]
DEFAULT_SHOTS = len(WORKED)
MAX_TOKENS = 200
DEFAULT_TOP_K = 3
DEFAULT_MAX_TURNS = 4


class SearchLog:
    """What the rollout's searches did, for the metrics."""

    def __init__(self) -> None:
        self.queries: list[str] = []
        self.empty = 0


def retrieve_tool(retriever: Retriever, top_k: int, log: SearchLog) -> FunctionTool:
    """The `retrieve(query)` function tool over one corpus."""

    def retrieve(query: str) -> str:
        """Search Wikipedia passages and return the best matches.

        Args:
            query: a few keywords, e.g. a name and the fact you need about it.
        """
        start = time.time()
        hits = retriever.search(query, top_k)
        log.queries.append(query)
        log.empty += not hits
        agl.record_span(
            RETRIEVAL_SPAN,
            kind=RETRIEVAL_KIND,
            start_time=start,
            end_time=time.time(),
            status="ok" if hits else "error",
            status_message=None if hits else "no passages found",
            attributes={
                ATTR_QUERY: query[:500],
                ATTR_RETRIEVER: retriever.kind,
                ATTR_HITS: len(hits),
                ATTR_PASSAGES: [h.passage.id for h in hits],
            },
        )
        return format_passages(hits) if hits else NO_PASSAGES

    return function_tool(retrieve, name_override="retrieve")


def build_agent(
    retriever: Retriever, top_k: int, log: SearchLog, prompts: Mapping[str, str] | None = None
) -> Agent[Any]:
    instructions = (prompts or {}).get(AGENT, RESEARCHER_INSTRUCTIONS)
    return Agent(
        name=AGENT,
        instructions=instructions,
        tools=[retrieve_tool(retriever, top_k, log)],
        model_settings=ModelSettings(max_tokens=MAX_TOKENS),
    )


def worked_items(shots: int) -> list[Any]:
    """The worked exchanges as Agents SDK input items (Responses-style; the chat-completions model converts them)."""
    items: list[Any] = []
    for i, (question, query, passages, answer) in enumerate(WORKED[:shots]):
        call_id = f"call_example_{i}"
        items += [
            {"role": "user", "content": question},
            {
                "type": "function_call",
                "call_id": call_id,
                "name": "retrieve",
                "arguments": json.dumps({"query": query}),
            },
            {"type": "function_call_output", "call_id": call_id, "output": passages},
            {"role": "assistant", "content": f"Answer: {answer}"},
        ]
    return items


@agl.rollout
async def solve(task: dict[str, Any], llm: agl.LLM) -> float:
    agl_openai_agents.instrument()  # names the researcher's LLM calls, records tool spans (idempotent)
    top_k = int(task.get("top_k") or DEFAULT_TOP_K)
    max_turns = int(task.get("max_turns") or DEFAULT_MAX_TURNS)
    # Off the event loop: the first rollout of a worker builds the index (dense: may embed the whole corpus).
    retriever = await asyncio.to_thread(
        get_retriever,
        task["corpus_path"],
        str(task.get("retriever") or "bm25"),
        embedding_url=task.get("embedding_url"),
        embedding_model=task.get("embedding_model"),
    )
    log = SearchLog()
    agent = build_agent(retriever, top_k, log, task.get("prompts"))
    stopped = "answered"
    async with AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key) as client:
        model = OpenAIChatCompletionsModel(model=llm.model, openai_client=client)
        try:
            shots = int(task.get("shots", DEFAULT_SHOTS))
            conversation = [*worked_items(shots), {"role": "user", "content": task["question"]}]
            result = await Runner.run(agent, conversation, max_turns=max_turns, run_config=RunConfig(model=model))
            reply = str(result.final_output or "")
        except MaxTurnsExceeded:
            reply, stopped = "", "max_turns"  # no final answer: scored as an empty one
    prediction = extract_answer(reply)
    answers = [str(a) for a in task["answers"]]
    metrics = {**score(prediction, answers), "retrievals": float(len(log.queries))}
    report(
        metrics,
        prediction=prediction,
        gold=answers[0] if answers else None,
        reply=reply,
        stopped=stopped,
        queries=log.queries,
        empty_retrievals=log.empty,
        hops=task.get("hops"),
    )
    return metrics["f1"]
