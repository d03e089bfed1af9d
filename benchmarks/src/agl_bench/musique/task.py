"""The MuSiQue benchmark as the harness sees it."""

from __future__ import annotations

from agl_bench.musique.air import AGENT, air_rules
from agl_bench.musique.data import SPLITS, load
from agl_bench.task import BenchTask

TASK = BenchTask(
    name="musique",
    description="MuSiQue-Ans multi-hop QA: an OpenAI Agents SDK researcher searches a 5k-paragraph corpus (BM25)",
    agent="agl_bench.musique.agent:solve",
    splits=SPLITS,
    train_split="train",
    eval_split="dev",
    metrics=("f1", "em", "retrievals"),
    agents=(AGENT,),
    trainable_agents=(AGENT,),
    load=load,
    air_rules=air_rules,
    recommended={"steps": 8, "tasks_per_step": 8, "group_size": 4, "eval_every": 4, "lr": 3e-4},
)
