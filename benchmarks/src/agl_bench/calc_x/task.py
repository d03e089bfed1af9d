"""Calc-X as a benchmark task: what `agl bench eval calc_x` / `agl bench train calc_x` run."""

from __future__ import annotations

from agl_bench.calc_x import AGENT_NAME
from agl_bench.calc_x.air import air_rules
from agl_bench.calc_x.data import SPLITS, load
from agl_bench.task import BenchTask

TASK = BenchTask(
    name="calc_x",
    description=(
        "Calc-X math word problems (GSM8K, Ape210K, AQuA-RAT, SVAMP, ...): an AutoGen AssistantAgent with a safe "
        "calculator tool; reward 1 when its final answer matches the gold one (1% relative tolerance)"
    ),
    agent="agl_bench.calc_x.agent:solve",
    splits=SPLITS,
    train_split="train",
    eval_split="test",
    metrics=("accuracy", "tool_calls", "tool_errors"),
    agents=(AGENT_NAME,),
    trainable_agents=(AGENT_NAME,),
    load=load,
    air_rules=air_rules,
    recommended={"steps": 8, "tasks_per_step": 8, "group_size": 4, "eval_every": 4, "lr": 3e-4},
)
