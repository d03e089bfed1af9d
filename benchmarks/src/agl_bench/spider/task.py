"""Spider as a benchmark task: what `agl bench eval spider` / `agl bench train spider` run."""

from __future__ import annotations

from agl_bench.spider.air import air_rules
from agl_bench.spider.data import SPLITS, load
from agl_bench.task import BenchTask

TASK = BenchTask(
    name="spider",
    description=(
        "Spider text-to-SQL (dev subset, 15 databases): a LangGraph writer → execute → checker → rewriter agent, "
        "scored by execution accuracy; train/test are disjoint by database"
    ),
    agent="agl_bench.spider.agent:solve",
    splits=SPLITS,
    train_split="train",
    eval_split="test",
    metrics=("execution_accuracy", "executable", "turns"),
    agents=("writer", "checker", "rewriter"),
    trainable_agents=("writer", "rewriter"),
    load=load,
    air_rules=air_rules,
    recommended={"steps": 8, "tasks_per_step": 8, "group_size": 4, "eval_every": 4, "lr": 3e-4},
)
