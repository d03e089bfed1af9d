"""Training recipes for `agl bench train`: 'cpu' (each task's small embedded recipe) or a TOML/JSON file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import tomllib

from agl_bench.task import BenchTask

# What every CPU recipe shares: held-out evaluation decoded greedily, as `agl bench eval` does, so the
# curve's first point is the baseline that `agl bench eval` reports for the same rows.
CPU_DEFAULTS: dict[str, Any] = {"model": "bundled", "eval_temperature": 0.0, "temperature": 1.0, "workers": 1}


def read_recipe(recipe: str, task: BenchTask) -> dict[str, Any]:
    if recipe == "cpu":
        return {**CPU_DEFAULTS, **task.recommended}
    path = Path(recipe)
    if not path.is_file():
        raise ValueError(f"recipe {recipe!r} is neither 'cpu' nor a file")
    try:
        data = tomllib.loads(path.read_text()) if path.suffix == ".toml" else json.loads(path.read_text())
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"recipe {path} is not valid: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"recipe {path} must hold a table of training options")
    options = {str(k).replace("-", "_"): v for k, v in data.items()}
    task_name = options.pop("task", task.name)
    if task_name != task.name:
        raise ValueError(f"recipe {path} is for task {task_name!r}, not {task.name!r}")
    if "lora_targets" in options:
        options["lora_targets"] = tuple(options["lora_targets"])
    return options
