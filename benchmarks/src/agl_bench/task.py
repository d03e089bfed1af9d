"""What a benchmark task is to the harness: its data, its agent, its metrics, its AIR rules, its recipe.

Each task package defines `TASK` in `agl_bench/<name>/task.py`; the registry names them by string so that
choosing one task imports nothing of the others (their frameworks are heavy).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agl.learn.air import AirRule


@dataclass(frozen=True)
class BenchTask:
    name: str
    description: str
    agent: str  # `module:function` decorated with @agl.rollout, run by `agl worker`
    splits: tuple[str, ...]
    train_split: str  # what `agl bench train` trains on
    eval_split: str  # what `agl bench eval` and training's held-out evaluation use by default
    metrics: tuple[str, ...]  # metrics[0] is the primary one: the reward the agent returns
    agents: tuple[str, ...]  # the agent names the system's LLM calls carry
    trainable_agents: tuple[str, ...]  # the default `--agents` of `agl bench train`
    # (datasets root, split) → task inputs: JSON objects that `agl worker` hands to the agent
    load: Callable[[Path, str], list[dict[str, Any]]]
    air_rules: Callable[[], tuple[AirRule, ...]]
    # `agl bench train` options for the embedded CPU trainer (the flags win)
    recommended: Mapping[str, Any] = field(default_factory=dict)


TASKS = {
    "spider": "agl_bench.spider.task:TASK",
    "musique": "agl_bench.musique.task:TASK",
    "calc_x": "agl_bench.calc_x.task:TASK",
    "quixbugs": "agl_bench.quixbugs.task:TASK",
    "swebench": "agl_bench.swebench.task:TASK",
}


def get_task(name: str) -> BenchTask:
    spec = TASKS.get(name.replace("-", "_"))
    if spec is None:
        raise ValueError(f"unknown benchmark task {name!r}; choose one of {', '.join(sorted(TASKS))}")
    module, _, attr = spec.partition(":")
    task = getattr(importlib.import_module(module), attr)
    assert isinstance(task, BenchTask)
    return task
