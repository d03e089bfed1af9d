"""The evaluation harness and `agl bench` command line, with a small agent against the scripted upstream (a real
`agl serve`, real workers, real HTTP); the three tasks' own agents have their own end-to-end tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from agl.cli.main import cli
from agl.learn.air import ToolStatusRule
from agl_bench.evaluation import EvalConfig, ModelSpec, run_eval
from agl_bench.recipes import read_recipe
from agl_bench.task import BenchTask, get_task

HERE = Path(__file__).parent


def _task() -> BenchTask:
    return BenchTask(
        name="echo",
        description="echo the question",
        agent=f"{HERE / 'harness_agent.py'}:solve",
        splits=("test",),
        train_split="test",
        eval_split="test",
        metrics=("exact", "length"),
        agents=("echoer",),
        trainable_agents=("echoer",),
        load=lambda root, split: [],
        air_rules=lambda: (ToolStatusRule(),),
        recommended={"steps": 3},
    )


@pytest.mark.slow
def test_eval_scores_every_row_and_counts_failures_as_zero(tmp_path: Path, agl_upstream: str) -> None:
    rows = [
        {"id": "a", "question": "hello", "answer": "hello"},
        {"id": "b", "question": "hello there", "answer": "something else"},
        {"id": "c", "question": "please crash", "answer": "x"},
    ]
    config = EvalConfig(_task(), "test", rows, ModelSpec(agl_upstream), tmp_path / "out", concurrency=2)
    report = run_eval(config)
    assert report.n == 3
    assert report.metrics["exact"] == pytest.approx(1 / 3)  # the crash scores 0 and still counts
    assert report.failed == 1 and report.no_outcome == 1
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    by_id = {row["id"]: row for row in saved["rows"]}
    assert by_id["a"]["metrics"]["exact"] == 1.0 and by_id["a"]["prediction"] == "Echo: hello"
    assert by_id["a"]["agents"] == {"echoer": 1}
    assert by_id["b"]["metrics"]["exact"] == 0.0 and by_id["b"]["gold"] == "something else"
    assert by_id["c"]["status"].startswith("failed") and "crashed" in (by_id["c"]["error"] or "")
    assert (tmp_path / "out" / "agl.sqlite").exists()  # the store stays for `agl show`


@pytest.mark.slow
def test_an_evaluation_longer_than_one_rollouts_limit_is_not_cut_off(tmp_path: Path, agl_upstream: str) -> None:
    # one at a time, each rollout ~1 s of a 5 s limit: 7 s and more in all, longer than one rollout's limit + 1 s
    rows = [{"id": str(i), "question": "hi", "answer": "hi", "sleep_s": 1.0} for i in range(7)]
    config = EvalConfig(_task(), "test", rows, ModelSpec(agl_upstream), tmp_path / "out", concurrency=1)
    config.rollout_timeout_s, config.stall_margin_s = 5.0, 1.0
    report = run_eval(config)
    assert report.n == 7 and report.failed == 0 and report.metrics["exact"] == 1.0


def test_eval_refuses_a_model_that_is_neither_embedded_url_nor_folder(tmp_path: Path) -> None:
    config = EvalConfig(_task(), "test", [{"id": "a"}], ModelSpec(str(tmp_path / "nope")), tmp_path / "out")
    with pytest.raises(ValueError, match="neither 'embedded', an http"):
        run_eval(config)


def test_unknown_task_split_and_data_folder_are_named() -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["bench", "eval", "calc_x", "--split", "nope", "--limit", "1"])
    assert result.exit_code != 0 and "has no split 'nope'" in result.output
    result = runner.invoke(cli, ["bench", "eval", "calc_x", "--data", "/no/such/folder"])
    assert result.exit_code != 0 and "/no/such/folder does not exist" in result.output
    result = runner.invoke(cli, ["bench", "eval", "calc_x", "--set", "novalue", "--limit", "1"])
    assert result.exit_code != 0 and "expected KEY=VALUE" in result.output
    with pytest.raises(ValueError, match="unknown benchmark task 'wikisql'"):
        get_task("wikisql")


def test_list_names_the_four_tasks() -> None:
    result = CliRunner().invoke(cli, ["bench", "list"])
    assert result.exit_code == 0, result.output
    for name in ("spider", "musique", "calc_x", "quixbugs"):
        assert name in result.output


def test_recipe_files_are_checked(tmp_path: Path) -> None:
    task = _task()
    assert read_recipe("cpu", task)["steps"] == 3 and read_recipe("cpu", task)["eval_temperature"] == 0.0
    wrong = tmp_path / "r.toml"
    wrong.write_text('task = "spider"\nsteps = 2\n')
    with pytest.raises(ValueError, match="is for task 'spider', not 'echo'"):
        read_recipe(str(wrong), task)
    broken = tmp_path / "b.toml"
    broken.write_text("steps = = 2")
    with pytest.raises(ValueError, match="is not valid"):
        read_recipe(str(broken), task)
    with pytest.raises(ValueError, match="neither 'cpu' nor a file"):
        read_recipe("gpu-please", task)


@pytest.mark.parametrize("name", ["spider", "musique", "calc_x", "quixbugs"])
def test_shipped_gpu_recipes_parse_for_their_task(name: str) -> None:
    from agl_trainer.options import build_config, unknown_keys

    task = get_task(name)
    options = read_recipe(str(HERE.parent / "recipes" / f"{name}-gpu.toml"), task)
    assert options["device"] == "cuda" and options["engine"] == "vllm" and options["steps"] > 0
    assert unknown_keys(options) == []  # every key is an option the trainer knows
    config = build_config(task.agent, {**options, "train_tasks": [{}], "eval_tasks": [{}], "run_dir": "r"})
    config.validate()  # and the values pass the checks a run makes before it starts
    assert config.policy.lr == options["lr"]


@pytest.mark.parametrize("name", ["spider", "musique", "calc_x", "quixbugs"])
def test_shipped_gpu_recipes_plan_to_fit_the_hardware_they_name(name: str, tmp_path: Path) -> None:
    from agl_bench.recipes import recipe_hardware
    from agl_trainer.options import build_config
    from agl_trainer.plan.build import PlanRequest, make_plan
    from agl_trainer.plan.hardware import Hardware

    recipe = str(HERE.parent / "recipes" / f"{name}-gpu.toml")
    task = get_task(name)
    options = read_recipe(recipe, task)
    # the recipe's model, from its published config.json (the weights are not here)
    model = HERE.parents[1] / "packages" / "trainer" / "tests" / "data" / "models" / Path(options["model"]).name
    assert (model / "config.json").is_file(), f"no config.json for {options['model']} in {model.parent}"
    options = {**options, "model": str(model), "train_tasks": [{}], "eval_tasks": [{}], "run_dir": tmp_path}
    hardware = Hardware(**recipe_hardware(recipe))
    plan = make_plan(PlanRequest(build_config(task.agent, options), hardware, flash_attention=True))
    assert plan["fits"], plan["refusal"]
    assert plan["memory"]["peak_gib_per_gpu"] <= hardware.gpu_memory_gib


def test_limit_draws_the_same_rows_every_time_in_file_order() -> None:
    from agl_bench.datasets import DataError, limit_rows

    rows = [{"i": i} for i in range(100)]
    first, again = limit_rows(rows, 10), limit_rows(rows, 10)
    assert first == again and len(first) == 10
    assert [r["i"] for r in first] == sorted(r["i"] for r in first)
    assert [r["i"] for r in first] != list(range(10))  # not simply the first rows of a grouped file
    assert limit_rows(rows, 500) == rows and limit_rows(rows, None) == rows
    with pytest.raises(DataError, match="limit must be ≥ 1"):
        limit_rows(rows, 0)


def test_a_recipes_task_options_reach_every_task_input_and_flags_win(tmp_path: Path) -> None:
    from agl_bench.recipes import recipe_task_options

    recipe = str(HERE.parent / "recipes" / "quixbugs-gpu.toml")
    assert "task_options" not in read_recipe(recipe, get_task("quixbugs"))  # not a trainer option
    assert recipe_task_options(recipe) == {"harness": "mini-swe-agent", "harness_steps": 8, "max_tokens": 768}
    args = ["bench", "train", "quixbugs", "--recipe", recipe, "--train-limit", "1", "--eval-limit", "1"]
    model = HERE.parents[1] / "packages" / "trainer" / "tests" / "data" / "models" / "Qwen2.5-7B-Instruct"
    args += ["--model", str(model), "--run-dir", str(tmp_path / "run"), "--set", "harness_steps=2", "--plan"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert (
        "agents mini-swe-agent, task options harness=mini-swe-agent, harness_steps=2, max_tokens=768" in result.output
    )
    assert '"fits": true' in result.output
    broken = tmp_path / "b.toml"
    broken.write_text('task = "quixbugs"\ntask_options = 3\n')
    with pytest.raises(ValueError, match=r"\[task_options\] must be a table"):
        recipe_task_options(str(broken))
