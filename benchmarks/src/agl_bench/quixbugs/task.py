"""QuixBugs as a benchmark task: what `agl bench eval quixbugs` / `agl bench train quixbugs` run."""

from __future__ import annotations

from agl_bench.quixbugs import AGENT_NAME
from agl_bench.quixbugs.air import air_rules
from agl_bench.quixbugs.data import SPLITS, load
from agl_bench.task import BenchTask

TASK = BenchTask(
    name="quixbugs",
    description=(
        "QuixBugs program repair (40 Python programs, each with a one-line defect): a repairer rewrites the program "
        "in one call; reward: the share of the program's own test cases that pass (each under a time limit)"
    ),
    agent="agl_bench.quixbugs.agent:repair",
    splits=SPLITS,
    train_split="train",
    eval_split="test",
    metrics=("tests_passed_share", "repair_rate", "parses"),
    agents=(AGENT_NAME,),
    trainable_agents=(AGENT_NAME,),
    load=load,
    air_rules=air_rules,
    # 26 training programs: 4 a step in groups of 4 (GRPO needs several answers to one program to compare).
    # Evaluating runs each answer's tests (up to 20 s for one that hangs): evaluations are kept sparse.
    recommended={"steps": 8, "tasks_per_step": 4, "group_size": 4, "eval_every": 4, "lr": 3e-4},
)
