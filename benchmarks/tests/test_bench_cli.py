"""`agl bench eval` and `agl bench train` as a user runs them, on the real data: each task's agent against a
remote OpenAI-compatible endpoint (the scripted upstream, over HTTP), the embedded engine with a model folder
(a tiny random Llama), and one training step of the Calc-X agent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from agl.cli.main import cli
from agl_bench.task import get_task

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", ["spider", "musique", "calc_x"])
def test_eval_runs_each_task_against_an_openai_compatible_url(name: str, tmp_path: Path, agl_upstream: str) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(
        cli, ["bench", "eval", name, "--model", agl_upstream, "--limit", "3", "--out", str(out), "--concurrency", "3"]
    )
    assert result.exit_code == 0, result.output
    assert "agl bench eval" in result.output and "rows" in result.output
    saved = json.loads((out / "results.json").read_text())
    task = get_task(name)
    assert saved["n"] == 3 and saved["failed"] == 0 and saved["no_outcome"] == 0
    assert set(saved["metrics"]) >= set(task.metrics)
    for row in saved["rows"]:
        assert row["status"] == "succeeded"
        assert row["gold"]  # every row reported what it was scored against
        # every LLM call of the system carried one of the task's agent names
        assert set(row["agents"]) <= set(task.agents) and row["llm_calls"] >= 1
        assert 0.0 <= row["metrics"][task.metrics[0]] <= 1.0


def test_eval_with_a_model_folder_runs_the_embedded_engine(tmp_path: Path) -> None:
    from agl_trainer.models import build_tiny_llama

    model = build_tiny_llama(tmp_path / "tiny")
    out = tmp_path / "out"
    args = [
        "bench",
        "eval",
        "calc_x",
        "--model",
        str(model),
        "--limit",
        "2",
        "--out",
        str(out),
        "--set",
        "max_tokens=8",
    ]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "results.json").read_text())
    assert saved["n"] == 2 and saved["failed"] == 0
    assert all(row["agents"] == {"solver": row["llm_calls"]} for row in saved["rows"])
    assert (out / "logs" / "engine.log").exists()


def test_train_one_step_of_the_calc_x_agent_with_its_air_rules(tmp_path: Path) -> None:
    from agl_trainer.models import build_tiny_llama

    model = build_tiny_llama(tmp_path / "tiny")
    run = tmp_path / "run"
    args = ["bench", "train", "calc_x", "--model", str(model), "--device", "cpu", "--run-dir", str(run)]
    args += ["--steps", "1", "--tasks-per-step", "2", "--group-size", "2", "--train-limit", "4", "--eval-limit", "2"]
    args += ["--set", "max_tokens=8", "--set", "max_tool_iterations=1"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    config = json.loads((run / "config.json").read_text())
    assert config["air_rules"] == [rule.name for rule in get_task("calc_x").air_rules()]
    assert config["train_agents"] == "solver" and config["eval_temperature"] == 0.0
    assert len(config["train_tasks"]) == 4 and config["train_tasks"][0]["max_tokens"] == 8
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in rows] == ["eval", "train", "eval"]
    assert rows[1]["rollouts"] == 4 and rows[0]["n"] == 2
    assert (run / "learning_curve.png").exists()
