"""The MuSiQue agent in a real `agl worker`, through the real proxy, against the scripted upstream."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from musique_support import SMALL_CORPUS, embedding_server, write_jsonl

from agl.client import Client
from agl.common.processes import ServerProcess
from agl.learn.air import air_rewards
from agl.schema import RolloutDetail
from agl.testing.fixtures import wait_rollouts
from agl_bench.datasets import datasets_root
from agl_bench.musique.data import load
from agl_bench.musique.task import TASK
from agl_bench.results import read_outcome


def _scripted(*lines: str) -> dict[str, str]:
    return {"researcher": "\n".join(["You are researcher.", *lines])}


def _air(detail: RolloutDetail) -> dict[str, float]:
    return {r.name: r.value for r in air_rewards(detail, TASK.air_rules())}


def _system_prompt(request: dict[str, Any]) -> str:
    messages = request["messages"]
    assert isinstance(messages, list) and isinstance(messages[0], dict) and messages[0]["role"] == "system"
    return str(messages[0]["content"])


def _spans(detail: RolloutDetail, name: str) -> list[Any]:
    return sorted((s for s in detail.spans if s.name == name), key=lambda s: s.start_time)


@pytest.mark.slow
def test_agent_runs_in_an_agl_worker(
    agl_server: ServerProcess, agl_client: Client, agl_workers: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGL_CACHE_DIR", str(tmp_path / "cache"))  # the worker inherits it (dense embeddings)
    dev = load(datasets_root(), "dev")
    van_hook = next(t for t in dev if t["answers"] == ["Stanley"] and "Van Hook" in t["question"])
    small = str(write_jsonl(tmp_path / "small.jsonl", SMALL_CORPUS))
    search_then_say = _scripted("agl-tools: retrieve", "agl-say: Answer: {tool}")
    with embedding_server() as embeddings:
        tasks = [
            # 0: search the real corpus, then answer in the format
            {**van_hook, "prompts": _scripted("agl-tools: retrieve", "agl-say: Answer: Stanley")},
            # 1: the tool's result is what the model sees: the answer is the formatted top passage
            {"id": "t1", "question": "Which city is the capital of France?", "answers": ["Paris"],
             "corpus_path": small, "top_k": 1, "prompts": search_then_say},
            # 2: a search that finds nothing (the scripted model searches for the question itself)
            {**van_hook, "question": "?", "prompts": search_then_say},
            # 3: cut off after the first turn: no final answer
            {**van_hook, "max_turns": 1, "prompts": _scripted("agl-tools: retrieve", "agl-say: Answer: Stanley")},
            # 4: an answer without the `Answer:` format still scores (last line), but AIR notices
            {**van_hook, "prompts": _scripted("agl-say: I think it is Stanley")},
            # 5: dense retrieval through an embeddings endpoint
            {"id": "t5", "question": "What is the highest mountain?", "answers": ["Mount Everest"],
             "corpus_path": small, "top_k": 1, "retriever": "dense", "embedding_url": embeddings.url,
             "embedding_model": "hash-bow", "prompts": search_then_say},
        ]  # fmt: skip
        # the script calls each tool once per conversation: leave out the worked exchange (it holds a call)
        tasks = [{**task, "shots": 0} for task in tasks]
        ids = [r.id for task in tasks for r in agl_client.enqueue(task)]
        agl_workers(TASK.agent, agl_server.url)
        rollouts = wait_rollouts(agl_client, ids, timeout=90)
    assert [r.status.value for r in rollouts] == ["succeeded"] * len(tasks)
    details = [agl_client.rollout_detail(i) for i in ids]
    outcomes = [read_outcome(d) for d in details]
    assert all(o is not None for o in outcomes)
    metrics = [o.metrics for o in outcomes if o is not None]
    predictions = [o.prediction for o in outcomes if o is not None]

    # every LLM call is the researcher's, made with the task's (scripted) instructions
    for detail in details:
        assert detail.llm_calls and {c.agent_name for c in detail.llm_calls} == {"researcher"}
        assert all("You are researcher." in _system_prompt(c.request) for c in detail.llm_calls)
    assert [len(d.llm_calls) for d in details] == [2, 2, 2, 1, 1, 2]

    # the retrieve tool: one ok tool span per search, and a retrieval span with its hits
    assert [[s.status.value for s in _spans(d, "tool:retrieve")] for d in details] == [
        ["ok"],
        ["ok"],
        ["ok"],
        ["ok"],
        [],
        ["ok"],
    ]
    searches = [
        [(s.attributes["retrieval.hits"], s.status.value) for s in _spans(d, "musique:retrieval")] for d in details
    ]
    assert searches == [[(3, "ok")], [(1, "ok")], [(0, "error")], [(3, "ok")], [], [(1, "ok")]]
    assert _spans(details[2], "musique:retrieval")[0].attributes["retrieval.query"] == "?"
    assert _spans(details[5], "musique:retrieval")[0].attributes["retrieval.retriever"] == "dense"
    assert [m["retrievals"] for m in metrics] == [1, 1, 1, 1, 0, 1]

    # predictions and scores, computed by hand
    assert predictions[0] == "Stanley" and metrics[0]["f1"] == metrics[0]["em"] == 1.0
    # "[1] Paris: Paris is the capital and largest city of France" → 10 tokens, 1 shared with "Paris"
    assert predictions[1] == "[1] Paris: Paris is the capital and largest city of France"
    assert metrics[1]["f1"] == pytest.approx(2 * 0.1 / 1.1) and metrics[1]["em"] == 0.0
    assert predictions[2] is not None and predictions[2].startswith("No passages found")
    assert metrics[2]["f1"] == 0.0
    assert predictions[3] == "" and metrics[3]["f1"] == 0.0 and outcomes[3] is not None
    assert outcomes[3].info["stopped"] == "max_turns"
    # "I think it is Stanley": P = 1/5, R = 1
    assert predictions[4] == "I think it is Stanley" and metrics[4]["f1"] == pytest.approx(1 / 3)
    # "[1] Mount Everest: Everest is the highest mountain above sea level": 10 tokens, 2 shared
    assert predictions[5] is not None and predictions[5].startswith("[1] Mount Everest:")
    assert metrics[5]["f1"] == pytest.approx(2 * 0.2 / 1.2)

    # the returned reward is the F1
    returned = [[r.value for r in d.rewards if r.source.value == "returned"] for d in details]
    assert returned == [[pytest.approx(m["f1"])] for m in metrics]

    # AIR: the empty search and the missing answers are penalised, nothing else
    assert [_air(d) for d in details] == [
        {},
        {},
        {"air:empty_retrieval": -0.1},
        {"air:unparsable_answer": -0.1},
        {"air:unparsable_answer": -0.1},
        {},
    ]
    (empty,) = air_rewards(details[2], TASK.air_rules())
    first_call = min(details[2].llm_calls, key=lambda c: c.seq)
    assert empty.after_llm_seq == first_call.seq and empty.agent_name == "researcher"


@pytest.mark.slow
def test_the_worked_exchange_reaches_the_model_as_a_real_tool_call(
    agl_server: ServerProcess, agl_client: Client, agl_workers: Any, tmp_path: Path
) -> None:
    small = str(write_jsonl(tmp_path / "small.jsonl", SMALL_CORPUS))
    task = {"id": "w", "question": "Which city is the capital of France?", "answers": ["Paris"], "corpus_path": small}
    (rollout,) = agl_client.enqueue({**task, "prompts": _scripted("agl-say: Answer: Paris")})
    agl_workers(TASK.agent, agl_server.url)
    wait_rollouts(agl_client, [rollout.id], timeout=60)
    (call,) = agl_client.rollout_detail(rollout.id).llm_calls
    messages = call.request["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert messages[2]["tool_calls"][0]["function"]["name"] == "retrieve"
    assert messages[3]["tool_call_id"] == messages[2]["tool_calls"][0]["id"]
    assert messages[4]["content"].startswith("Answer: ") and messages[-1]["content"] == task["question"]
    outcome = read_outcome(agl_client.rollout_detail(rollout.id))
    assert outcome is not None and outcome.metrics["f1"] == 1.0
