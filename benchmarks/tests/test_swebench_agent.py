"""The SWE-bench agent end to end, in a real `agl worker` against `agl serve` and the scripted upstream: it clones a
small git repository made here (`repo_url` a local path; GitHub cannot be reached) at the instance's base commit,
mini-swe-agent (from .venv-harness) edits it with its `bash` tool as the `agl-step:` lines say and submits, and the
stored patch is the clone's `git diff` against the base commit, new file included. One rollout keeps its patch
(reward 0, `predictions` appended); one grades it with `evaluate: true` through a stand-in for the official
harness and for `docker` (Docker is not here), reward 1 as the report says it resolved."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_swebench_evaluate import fake_docker, fake_harness, harness_calls

from agl.client import Client
from agl.common.processes import ServerProcess
from agl.testing.fixtures import wait_rollouts
from agl.testing.upstream import step_line
from agl_bench.quixbugs.harness import mini_command
from agl_bench.results import read_outcome
from agl_bench.swebench.agent import PREDICTION_SPAN
from agl_bench.swebench.task import TASK

pytestmark = pytest.mark.slow

CALC = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"


def git(cwd: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", **env})
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture()
def origin(tmp_path: Path) -> tuple[Path, str]:
    """A repository with the base commit and one commit after it (the clone must be at the base, not the tip)."""
    repo = tmp_path / "calc"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "calc.py").write_text(CALC)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    (repo / "later.txt").write_text("after the base commit\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "later")
    return repo, base


def step(command: str) -> str:
    return step_line("bash", {"command": command})


FIX = "sed -i '2s/a - b/a + b/' calc.py"
NEW_TEST = "printf 'from calc import add\\n\\nassert add(2, 3) == 5\\n' > check_add.py"


def expected_patch(origin: Path, base: str, tmp_path: Path) -> str:
    """The same edits made by hand in a clone of its own, and git's diff of them."""
    clone = tmp_path / "by-hand"
    git(tmp_path, "clone", "-q", str(origin), str(clone))
    git(clone, "checkout", "-q", base)
    for command in (FIX, NEW_TEST):
        subprocess.run(command, shell=True, cwd=clone, check=True)
    git(clone, "add", "-A")
    return git(clone, "diff", "--cached", base)


def test_mini_swe_agent_edits_a_clone_at_the_base_commit_and_its_git_diff_is_the_patch(
    tmp_path: Path,
    origin: tuple[Path, str],
    agl_server: ServerProcess,
    agl_client: Client,
    agl_workers: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mini_command()  # FileNotFoundError says `make harnesses` when mini-swe-agent is not there
    repo, base = origin
    python = fake_harness(tmp_path)
    monkeypatch.setenv("AGL_DOCKER", str(fake_docker(tmp_path, answers=True)))  # the worker inherits it
    script = (
        "Resolve {instance_id} in {repo}.\n"
        + step("test ! -e later.txt && cat calc.py")
        + step(f"{FIX} && {NEW_TEST}")
        + step("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")
    )
    instance = {
        "id": "calc__calc-1",
        "instance_id": "calc__calc-1",
        "repo": "calc/calc",
        "base_commit": base,
        "problem_statement": "add() subtracts",
        "FAIL_TO_PASS": ["check_add.py::test_add"],
        "PASS_TO_PASS": [],
        "version": "1.0",
        "environment_setup_commit": base,
        "dataset": "princeton-nlp/SWE-bench_Lite",
        "split": "test",
        "dataset_file": str(tmp_path / "test.parquet"),
        "repo_url": str(repo),
        "harness_prompt": script,
        "harness_steps": 5,
    }
    predictions = tmp_path / "predictions.jsonl"
    tasks = [
        {**instance, "predictions": str(predictions), "model_name": "agl-test"},
        {**instance, "evaluate": True, "swebench_python": str(python), "eval_dir": str(tmp_path / "eval")},
    ]
    ids = [r.id for task in tasks for r in agl_client.enqueue(task)]
    agl_workers(TASK.agent, agl_server.url, concurrency=2)
    rollouts = wait_rollouts(agl_client, ids, timeout=180)
    details = [agl_client.rollout_detail(i) for i in ids]
    assert [r.status.value for r in rollouts] == ["succeeded"] * 2, [d.rollout.error for d in details]
    kept, graded = details
    patch = expected_patch(repo, base, tmp_path)
    assert "+    return a + b" in patch and "+++ b/check_add.py" in patch and "later.txt" not in patch

    outcome = read_outcome(kept)
    assert outcome is not None and outcome.prediction == patch
    assert outcome.metrics == {"patch_produced": 1.0}  # not graded: no `resolved` to report
    assert outcome.info["harness_exit"] == 0 and outcome.info["evaluated"] is False
    assert kept.rollout.final_reward == 0.0
    (span,) = [s for s in kept.spans if s.name == PREDICTION_SPAN]
    official = {"instance_id": "calc__calc-1", "model_name_or_path": "agl-test", "model_patch": patch}
    assert json.loads(str(span.attributes["swebench.prediction"])) == official
    assert [json.loads(line) for line in predictions.read_text().splitlines()] == [official]
    calls = sorted(kept.llm_calls, key=lambda c: c.seq)
    assert len(calls) == 3 and {c.agent_name for c in calls} == {"mini-swe-agent"} and all(c.trainable for c in calls)
    assert "return a - b" in str(calls[1].request["messages"][-1]["content"])  # `cat` showed it the base's file
    (cli,) = [s for s in kept.spans if s.name.startswith("cli:")]
    assert cli.attributes["cli.egress"] == []

    outcome = read_outcome(graded)
    assert outcome is not None and outcome.prediction == patch and graded.rollout.final_reward == 1.0
    assert outcome.metrics == {"patch_produced": 1.0, "resolved": 1.0} and outcome.info["status"] == "resolved"
    (call,) = harness_calls(python)
    argv = call["argv"]
    assert isinstance(argv, list) and argv[argv.index("--dataset_name") + 1] == str(tmp_path / "test.parquet")
    assert argv[argv.index("--instance_ids") + 1] == "calc__calc-1" and argv[argv.index("--max_workers") + 1] == "1"
