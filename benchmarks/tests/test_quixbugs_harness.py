"""QuixBugs through a coding harness as it ships (issue #44): mini-swe-agent, from .venv-harness, repairs the
program's file with its own `bash` tool in a real `agl worker` against the scripted upstream (whose `agl-step:`
lines make it read the file, overwrite it with the fix, and submit); the file as it left it is scored by the
program's tests. Then `agl bench train quixbugs --set harness=mini-swe-agent` for two steps with the bundled model:
the run, the stored calls under `mini-swe-agent` and the rewards (no learning is expected of a 135 M model)."""

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
from agl.testing.upstream import step_line
from agl_bench.datasets import datasets_root
from agl_bench.quixbugs.data import task_input
from agl_bench.quixbugs.harness import mini_command
from agl_bench.quixbugs.task import TASK
from agl_bench.results import read_outcome

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def folder() -> Path:
    mini_command()  # FileNotFoundError says `make harnesses` when mini-swe-agent is not there
    return datasets_root(None, "quixbugs") / "quixbugs"


def step(command: str) -> str:
    return step_line("bash", {"command": command})


def test_mini_swe_agent_repairs_the_file_and_its_tests_score_it(
    folder: Path, agl_server: ServerProcess, agl_client: Client, agl_workers: Any
) -> None:
    fixed = (folder / "correct_python_programs" / "gcd.py").read_text()
    script = (
        "Repair {file}.\n"
        + step("cat gcd.py")
        + step("python3 -c 'import gcd; assert gcd.gcd(35, 21) == 7'")  # its own test run, failing before the fix
        + step(f"cat > gcd.py <<'AGL_EOF'\n{fixed}AGL_EOF")
        + step("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")
    )
    gcd = task_input(folder, "gcd")
    tasks = [{**gcd, "harness": "mini-swe-agent", "harness_prompt": script}, {**gcd, "harness": "mini-swe-agent"}]
    ids = [r.id for task in tasks for r in agl_client.enqueue(task)]
    agl_workers(TASK.agent, agl_server.url, concurrency=2)
    rollouts = wait_rollouts(agl_client, ids, timeout=180)
    assert [r.status.value for r in rollouts] == ["succeeded"] * 2
    repaired, unscripted = (agl_client.rollout_detail(i) for i in ids)

    outcome = read_outcome(repaired)
    assert outcome is not None and outcome.metrics["tests_passed_share"] == 1.0 and outcome.info["harness_exit"] == 0
    calls = sorted(repaired.llm_calls, key=lambda c: c.seq)
    assert len(calls) == 4 and {c.agent_name for c in calls} == {"mini-swe-agent"} and all(c.trainable for c in calls)
    assert "def gcd" in str(calls[1].request["messages"][-1]["content"])  # `cat` showed it the program
    # the commands it ran, read from its trajectory as tool spans; the failing test run is an error span, and AIR
    # puts its penalty right after the call that asked for it (the second)
    commands = sorted((s for s in repaired.spans if s.name == "bash"), key=lambda s: s.start_time)
    assert [(s.status.value, s.attributes["tool.exit_code"]) for s in commands[:3]] == [
        ("ok", 0),
        ("error", 1),
        ("ok", 0),
    ]
    assert all(s.attributes.get("gen_ai.tool.call.id") for s in commands)  # each names the tool call it answers
    assert "Traceback" in str(commands[1].attributes["tool.output_tail"])  # the defective gcd never ends its recursion
    penalties = air_rewards(repaired, TASK.air_rules())
    (penalty,) = penalties
    assert (penalty.name, penalty.value, penalty.after_llm_seq) == ("air:command_failed", -0.1, calls[1].seq)
    (span,) = [s for s in repaired.spans if s.name.startswith("cli:")]
    assert span.attributes["cli.egress"] == []

    # unscripted, the upstream answers text without a tool call: mini gives up at its step limit, the file as it
    # was is scored (the defective program: less than 1), and its calls are still stored under its agent
    outcome = read_outcome(unscripted)
    assert outcome is not None and outcome.metrics["tests_passed_share"] < 1.0
    assert unscripted.llm_calls and {c.agent_name for c in unscripted.llm_calls} == {"mini-swe-agent"}


def test_two_training_steps_through_the_harness_with_the_bundled_model(folder: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = ["bench", "train", "quixbugs", "--device", "cpu", "--run-dir", str(run), "--agents", "mini-swe-agent"]
    # small, as CI runs it: one program a step in a group of two, one model call per rollout (mini's step limit),
    # a short answer, each test case bounded (a defective program may hang)
    args += ["--steps", "2", "--tasks-per-step", "1", "--group-size", "2", "--train-limit", "1", "--eval-limit", "1"]
    args += ["--eval-every", "2", "--set", "harness=mini-swe-agent", "--set", "harness_steps=1"]
    args += ["--set", "max_tokens=32", "--set", "case_timeout_s=2", "--set", "budget_s=4"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in rows] == ["eval", "train", "train", "eval"]
    trained = [r for r in rows if r["kind"] == "train"]
    for row in trained:
        assert row["rollouts"] == row["succeeded"] == 2, row
        # the harness's calls were selected by its agent name: one transition per call, one call per rollout
        assert row["transitions"] == 2 and row["missed_attribution"] == 0, row
        assert row.get("bypassed_llm_calls", 0) == 0, row
    assert (run / "learning_curve.png").exists()
