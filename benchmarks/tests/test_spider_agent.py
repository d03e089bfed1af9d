"""The Spider agent: its graph's control flow with a fake model, and whole rollouts in a real `agl worker`
through agl's proxy against the scripted upstream (its answers come from `agl-say:` lines in the system
prompts, which each task overrides)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage

from agl.client import Client
from agl.common.processes import ServerProcess
from agl.learn.air import air_rewards
from agl.schema import LLMCall, RolloutDetail, Span
from agl.testing.fixtures import wait_rollouts
from agl_bench.datasets import datasets_root
from agl_bench.results import read_outcome
from agl_bench.spider.agent import build_graph, format_result, initial_state, parse_verdict
from agl_bench.spider.data import load
from agl_bench.spider.evaluate import run_query
from agl_bench.spider.task import TASK

QUESTION = "How many singers do we have?"


@pytest.fixture(scope="module")
def singers_task() -> dict[str, Any]:
    """The first dev question whose gold query counts the singers of concert_singer."""
    return next(t for t in load(datasets_root(), "dev") if t["question"] == QUESTION)


def _run_graph(task: dict[str, Any], answers: list[str], **options: Any) -> tuple[dict[str, Any], list[str]]:
    """Run the graph outside any rollout with a model that gives `answers` in turn; return the final state and
    the system prompts the model was sent."""
    model = GenericFakeChatModel(messages=iter(AIMessage(a) for a in answers))
    sent: list[str] = []
    original = model._generate

    def spy(messages: list[Any], *args: Any, **kwargs: Any) -> Any:
        sent.append(str(messages[0].content))
        return original(messages, *args, **kwargs)

    object.__setattr__(model, "_generate", spy)
    prompts = {"writer": "W", "checker": "C", "rewriter": "R"}
    final = build_graph(model, prompts).invoke(initial_state({**task, **options}))  # type: ignore[arg-type]
    return final, sent


def test_graph_stops_when_the_checker_accepts(singers_task: dict[str, Any]) -> None:
    final, sent = _run_graph(singers_task, ["```sql\nSELECT count(*) FROM singer;\n```", "CORRECT."])
    assert sent == ["W", "C"]
    assert final["sql"] == "SELECT count(*) FROM singer" and final["correct"] and final["turns"] == 1
    assert final["result"].startswith("count(*)\n6\n(1 rows)")


def test_graph_rewrites_until_accepted_or_out_of_turns(singers_task: dict[str, Any]) -> None:
    answers = ["SELECT count(*) FROM singers", "WRONG: no such table", "SELECT count(*) FROM singer", "Correct"]
    final, sent = _run_graph(singers_task, answers)
    assert sent == ["W", "C", "R", "C"]
    assert final["sql"] == "SELECT count(*) FROM singer" and final["turns"] == 2

    # the checker never accepts: three queries written, the last one not checked
    answers = ["SELECT 1", "Incorrect.", "SELECT 2", "It is not correct", "SELECT 3"]
    final, sent = _run_graph(singers_task, answers)
    assert sent == ["W", "C", "R", "C", "R"]
    assert final["sql"] == "SELECT 3" and final["turns"] == 3 and not final["correct"]

    final, sent = _run_graph(singers_task, ["I do not know."], max_turns=1)
    assert sent == ["W"] and final["sql"] is None and final["result"].startswith("Error:")


def test_verdict_and_result_text() -> None:
    assert parse_verdict("CORRECT") and parse_verdict("The query is correct.")
    for review in ("WRONG: it counts stadiums", "Incorrect", "This is not correct.", "No idea", ""):
        assert not parse_verdict(review), review
    singers = datasets_root() / "spider" / "database" / "concert_singer" / "concert_singer.sqlite"
    many = format_result(run_query(singers, "SELECT name, age FROM singer"))
    assert many.splitlines()[0] == "Name | Age" and many.endswith("...\n(6 rows)") and len(many.splitlines()) == 8
    assert format_result(run_query(singers, "SELECT x FROM singer")) == "Error: OperationalError: no such column: x"


# ------------------------------------------------------------------------------------- real worker


def _calls(detail: RolloutDetail) -> list[LLMCall]:
    return sorted(detail.llm_calls, key=lambda c: c.seq)


def _sql_spans(detail: RolloutDetail) -> list[Span]:
    spans = [s for s in detail.spans if s.attributes.get("agl.span.kind") == "tool"]
    return sorted(spans, key=lambda s: s.start_time)


@pytest.mark.slow
def test_agent_in_a_real_worker(
    singers_task: dict[str, Any],
    agl_server: ServerProcess,
    agl_client: Client,
    agl_workers: Callable[..., subprocess.Popen[bytes]],
) -> None:
    accepted = {
        "writer": "agl-say: SELECT count(*) FROM singer",
        "checker": "agl-say: CORRECT",
        "rewriter": "agl-say: SELECT 1",
    }
    fixed = {  # the first query fails, the checker rejects it, the rewrite is right
        "writer": "agl-say: SELECT count(*) FROM singers",
        "checker": "agl-say: WRONG, there is no table singers",
        "rewriter": "agl-say: Fixed: ```sql SELECT count(*) FROM singer; ```",
    }
    no_sql = {"writer": "agl-say: I do not know.", "checker": "agl-say: CORRECT", "rewriter": "agl-say: SELECT 1"}
    tasks = [
        {**singers_task, "prompts": accepted},
        {**singers_task, "prompts": fixed, "max_turns": 2},
        {**singers_task, "prompts": no_sql, "max_turns": 1},
    ]
    ids = [r.id for task in tasks for r in agl_client.enqueue(task)]
    agl_workers(TASK.agent, agl_server.url, concurrency=3)
    done = wait_rollouts(agl_client, ids, timeout=90)
    assert [r.status.value for r in done] == ["succeeded"] * 3
    first, second, third = (agl_client.rollout_detail(i) for i in ids)

    # the checker accepts at once: writer and checker only, one successful query, reward 1
    assert [c.agent_name for c in _calls(first)] == ["writer", "checker"]
    assert [(s.name, s.status.value, s.agent_name) for s in _sql_spans(first)] == [("tool:execute_sql", "ok", "writer")]
    assert [r.value for r in first.rewards] == [1.0]
    outcome = read_outcome(first)
    assert outcome is not None
    assert outcome.metrics == {"execution_accuracy": 1.0, "turns": 1.0, "executable": 1.0}
    assert outcome.prediction == "SELECT count(*) FROM singer" and outcome.gold == singers_task["query"]
    assert air_rewards(first, TASK.air_rules()) == []

    # the first query fails (an error span charged to the writer), the rewriter's query is right
    calls = _calls(second)
    assert [c.agent_name for c in calls] == ["writer", "checker", "rewriter"]
    spans = _sql_spans(second)
    assert [(s.status.value, s.agent_name) for s in spans] == [("error", "writer"), ("ok", "rewriter")]
    assert "no such table: singers" in (spans[0].status_message or "")
    assert [r.value for r in second.rewards] == [1.0]
    outcome = read_outcome(second)
    assert outcome is not None and outcome.prediction == "SELECT count(*) FROM singer"
    assert outcome.metrics == {"execution_accuracy": 1.0, "turns": 2.0, "executable": 1.0}
    (penalty,) = air_rewards(second, TASK.air_rules())
    assert (penalty.name, penalty.value, penalty.agent_name) == ("air:sql_error", -0.1, "writer")
    assert penalty.after_llm_seq == calls[0].seq
    # the checker saw the error the query gave
    assert "no such table: singers" in str(calls[1].request)

    # no SQL at all: nothing runs, reward 0, the no-SQL rule penalises the writer's answer
    assert [c.agent_name for c in _calls(third)] == ["writer"]
    assert _sql_spans(third) == []
    assert [r.value for r in third.rewards] == [0.0]
    outcome = read_outcome(third)
    assert outcome is not None and outcome.metrics["executable"] == 0.0 and outcome.prediction == ""
    (penalty,) = air_rewards(third, TASK.air_rules())
    assert (penalty.name, penalty.value, penalty.after_llm_seq) == ("air:no_sql", -0.2, _calls(third)[0].seq)
