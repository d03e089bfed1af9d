"""End to end: the QuixBugs repairer in a real `agl worker`, through the real proxy, against the scripted upstream;
and `agl bench eval quixbugs` as a user runs it.

A system-message override scripts the model (`agl-say: <text>` answers that text): a one-line corrected `gcd`
scores 1.0, an answer without a program 0 with the AIR penalty. Without a script the upstream echoes the question,
which holds the defective program in a python block: the evaluator then runs the defective program (< 1)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agl.cli.main import cli
from agl.client import Client
from agl.common.processes import ServerProcess
from agl.learn.air import air_rewards
from agl.testing.fixtures import wait_rollouts
from agl_bench.datasets import datasets_root
from agl_bench.quixbugs.agent import user_message
from agl_bench.quixbugs.data import task_input
from agl_bench.quixbugs.task import TASK
from agl_bench.results import read_outcome

pytestmark = pytest.mark.slow

FIXED_GCD = "agl-say: def gcd(a, b): return gcd(b, a % b) if b else a"


@pytest.fixture(scope="module")
def folder() -> Path:
    # DataError names the folders looked in and says to run `agl bench data fetch quixbugs` when there is none
    return datasets_root(None, "quixbugs") / "quixbugs"


def test_agent_in_a_worker(folder: Path, agl_server: ServerProcess, agl_client: Client, agl_workers: Any) -> None:
    agl_workers(TASK.agent, agl_server.url, concurrency=3)
    gcd = task_input(folder, "gcd")
    tasks = [
        {**gcd, "prompts": {"repairer": FIXED_GCD}},
        {**gcd, "prompts": {"repairer": "agl-say: I am not sure what is wrong."}},
        gcd,  # the echo of the question: the defective program itself
    ]
    ids = [r.id for task in tasks for r in agl_client.enqueue(task)]
    rollouts = wait_rollouts(agl_client, ids, timeout=90)
    assert [r.status.value for r in rollouts] == ["succeeded"] * 3, [
        d.attempts for d in agl_client.rollout_details(ids)
    ]
    fixed, no_program, echoed = (agl_client.rollout_detail(i) for i in ids)
    for detail in (fixed, no_program, echoed):
        (call,) = detail.llm_calls
        assert call.agent_name == "repairer"
        assert call.request["messages"][1]["content"] == user_message(gcd, "{description}```python\n{source}\n```")

    outcome = read_outcome(fixed)
    assert outcome is not None and outcome.metrics == {"tests_passed_share": 1.0, "repair_rate": 1.0, "parses": 1.0}
    assert outcome.info["passed"] == outcome.info["total"] == 6 and outcome.gold == "the 6 test cases of gcd"
    assert air_rewards(fixed, TASK.air_rules()) == []

    outcome = read_outcome(no_program)
    assert outcome is not None and outcome.metrics == {"tests_passed_share": 0.0, "repair_rate": 0.0, "parses": 0.0}
    assert "does not parse" in outcome.info["error"]
    assert [(r.name, r.value) for r in air_rewards(no_program, TASK.air_rules())] == [("air:no_program", -0.5)]

    outcome = read_outcome(echoed)
    assert outcome is not None and 0.0 < outcome.metrics["tests_passed_share"] < 1.0
    assert outcome.metrics["parses"] == 1.0 and outcome.info["failures"]


def test_bench_eval_runs_the_task_against_an_openai_compatible_url(tmp_path: Path, agl_upstream: str) -> None:
    out = tmp_path / "out"
    args = ["bench", "eval", "quixbugs", "--model", agl_upstream, "--limit", "3", "--out", str(out)]
    result = CliRunner().invoke(cli, [*args, "--concurrency", "3"])
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "results.json").read_text())
    assert saved["n"] == 3 and saved["failed"] == 0 and saved["no_outcome"] == 0
    assert set(saved["metrics"]) >= set(TASK.metrics)
    for row in saved["rows"]:
        assert row["status"] == "succeeded" and row["gold"].startswith("the ")
        assert row["agents"] == {"repairer": 1} and row["llm_calls"] == 1
        # the echoed defective program: its tests run, and it fails some of them
        assert 0.0 <= row["metrics"]["tests_passed_share"] < 1.0 and row["metrics"]["parses"] == 1.0
