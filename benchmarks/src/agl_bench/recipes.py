"""Training recipes for `agl bench train`: 'cpu' (each task's small embedded recipe) or a TOML/JSON file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agl_bench.task import BenchTask
from agl_trainer.options import read_option_file

# What every CPU recipe shares: held-out evaluation decoded greedily, as `agl bench eval` does, so the
# curve's first point is the baseline that `agl bench eval` reports for the same rows.
CPU_DEFAULTS: dict[str, Any] = {"model": "bundled", "eval_temperature": 0.0, "temperature": 1.0, "workers": 1}


def read_recipe(recipe: str, task: BenchTask) -> dict[str, Any]:
    if recipe == "cpu":
        return {**CPU_DEFAULTS, **task.recommended}
    path = Path(recipe)
    if not path.is_file():
        raise ValueError(f"recipe {recipe!r} is neither 'cpu' nor a file")
    options = read_option_file(path)  # the same reader as `agl train --config`
    task_name = options.pop("task", task.name)
    if task_name != task.name:
        raise ValueError(f"recipe {path} is for task {task_name!r}, not {task.name!r}")
    return options
