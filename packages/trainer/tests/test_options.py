"""One path from flags, option files and recipes to TrainConfig: defaults and choices come from the code."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from agl.learn.credit import STRATEGIES
from agl_trainer.options import SPECS, build_config, click_options, known_keys, merge, read_option_file
from agl_trainer.policy.trainer import PolicyConfig
from agl_trainer.run.loop import TrainConfig

BASE = {"train_tasks": [1], "eval_tasks": [2], "run_dir": "runs/x"}


def command(*keys: str) -> click.Command:
    @click.command()
    @click_options(*keys)
    def cmd(**flags: Any) -> None:
        click.echo(repr(sorted((k, v) for k, v in flags.items() if v is not None)))

    return cmd


def test_every_spec_names_a_config_field_and_the_help_shows_the_code_defaults() -> None:
    assert set(SPECS) <= known_keys()
    help_text = " ".join(CliRunner().invoke(command(*SPECS), ["--help"]).output.split())
    assert f"Policy updates. [default: {TrainConfig.__dataclass_fields__['steps'].default}]" in help_text
    assert f"Learning rate. [default: {PolicyConfig().lr}]" in help_text
    assert "[" + "|".join(sorted(STRATEGIES)) + "]" in help_text  # the registry's strategies, not a copy


def test_flags_not_given_stay_unset_so_option_files_apply() -> None:
    out = CliRunner().invoke(command("steps", "lr", "train_agents", "resume"), ["--steps", "3", "--agents", "a,b*"])
    assert out.exit_code == 0 and out.output.strip() == "[('steps', 3), ('train_agents', 'a,b*')]"
    bad = CliRunner().invoke(command("strategy"), ["--strategy", "nope"])
    assert bad.exit_code == 2 and "'nope' is not one of" in bad.output


def test_option_files_toml_and_json_read_alike(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text('steps = 3\ngroup-size = 2\nlora_targets = ["q_proj"]\n')
    (tmp_path / "a.json").write_text('{"steps": 3, "group-size": 2, "lora_targets": ["q_proj"]}')
    assert read_option_file(tmp_path / "a.toml") == read_option_file(tmp_path / "a.json")
    (tmp_path / "bad.toml").write_text("steps = = 3")
    with pytest.raises(ValueError, match=r"bad\.toml is not valid TOML"):
        read_option_file(tmp_path / "bad.toml")
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(ValueError, match="must hold a table"):
        read_option_file(tmp_path / "list.json")
    with pytest.raises(ValueError, match="does not exist"):
        read_option_file(tmp_path / "missing.toml")


def test_build_config_splits_policy_fields_and_refuses_unknown_keys() -> None:
    options = merge(BASE, {"steps": 3, "lr": 1e-3, "lora_targets": ["q_proj"], "full_finetune": None}, {"steps": 4})
    config = build_config("m:f", options)
    expected = TrainConfig(
        agent="m:f",
        train_tasks=[1],
        eval_tasks=[2],
        run_dir=Path("runs/x"),
        steps=4,
        policy=PolicyConfig(lr=1e-3, lora_targets=("q_proj",)),
    )
    assert config == expected
    assert build_config("m:f", {**BASE, "full_finetune": True}).policy.lora is False
    with pytest.raises(ValueError, match=r"unknown option\(s\) in recipe.toml: stepz \(known: .*steps"):
        build_config("m:f", {**BASE, "stepz": 3}, where="recipe.toml")
    with pytest.raises(ValueError, match="give no eval_tasks"):
        build_config("m:f", {"train_tasks": [1], "run_dir": "r"})


def test_known_keys_are_exactly_the_config_fields() -> None:
    names = {f.name for f in dataclasses.fields(TrainConfig)} | {f.name for f in dataclasses.fields(PolicyConfig)}
    assert known_keys() == (names - {"policy"}) | {"full_finetune"}


def test_the_trainer_flags_reach_the_config_and_both_clis() -> None:
    from click.testing import CliRunner

    from agl_bench.cli import bench
    from agl_trainer.cli import train

    cluster = {"trainer": "verl", "trainer_workers": 2, "ray_address": "10.0.0.1:6379"}
    config = build_config("m:f", {**BASE, **cluster, "checkpoint_dir": "/shared/ckpt"})
    assert (config.trainer, config.trainer_workers, config.ray_address) == ("verl", 2, "10.0.0.1:6379")
    assert config.checkpoint_dir == Path("/shared/ckpt")
    config.validate()
    with pytest.raises(ValueError, match="checkpoint_dir, a folder every node mounts"):
        build_config("m:f", {**BASE, **cluster}).validate()
    with pytest.raises(ValueError, match="trainer_workers and ray_address are verl's"):
        build_config("m:f", {**BASE, "trainer_workers": 2}).validate()
    with pytest.raises(ValueError, match="trainer must be 'agl' or 'verl'"):
        build_config("m:f", {**BASE, "trainer": "trl"}).validate()
    for cli, args in ((train, ["--help"]), (bench, ["train", "--help"])):
        shown = CliRunner().invoke(cli, args).output
        assert "--trainer [agl|verl]" in shown and "--trainer-workers" in shown and "--ray-address" in shown
        assert "--checkpoint-dir" in shown and "--rollout-gpus" in shown and "--plan" in shown and "--verl-set" in shown
