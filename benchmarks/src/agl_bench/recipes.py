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
    options.pop("hardware", None)  # what it is sized for: recipe_hardware
    options.pop("task_options", None)  # what every task input carries: recipe_task_options
    task_name = options.pop("task", task.name)
    if task_name != task.name:
        raise ValueError(f"recipe {path} is for task {task_name!r}, not {task.name!r}")
    return options


def recipe_hardware(recipe: str) -> dict[str, Any]:
    """The `[hardware]` table of a recipe file (gpus_per_node, nodes, gpu_memory_gib): what `--plan` plans for
    unless flags say otherwise; empty for 'cpu' and for files without one."""
    if recipe == "cpu":
        return {}
    table = read_option_file(Path(recipe)).get("hardware") or {}
    if not isinstance(table, dict):
        raise ValueError(f"recipe {recipe}: [hardware] must be a table")
    known = {"gpus_per_node", "nodes", "gpu_memory_gib"}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ValueError(f"recipe {recipe}: [hardware] has unknown keys {', '.join(unknown)} (known: {sorted(known)})")
    return dict(table)


def recipe_task_options(recipe: str) -> dict[str, Any]:
    """The `[task_options]` table of a recipe file: options every task input carries to the agent, as `--set`
    gives them (the flags win), e.g. QuixBugs' `harness = "mini-swe-agent"`; empty for 'cpu'."""
    if recipe == "cpu":
        return {}
    table = read_option_file(Path(recipe)).get("task_options") or {}
    if not isinstance(table, dict):
        raise ValueError(f"recipe {recipe}: [task_options] must be a table")
    return dict(table)
