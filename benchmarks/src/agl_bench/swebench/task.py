"""SWE-bench Lite / Verified as a benchmark task: what `agl bench eval swebench` / `agl bench train swebench` run."""

from __future__ import annotations

from agl.learn.air import AirRule
from agl_bench.swebench import HARNESS
from agl_bench.swebench.data import SPLITS, load
from agl_bench.task import BenchTask


def air_rules() -> tuple[AirRule, ...]:
    # mini-swe-agent's tool calls run inside its own process: agl stores its model calls, not tool spans
    return ()


TASK = BenchTask(
    name="swebench",
    description=(
        "SWE-bench Lite / Verified: mini-swe-agent resolves a GitHub issue in a clone of its repository; reward: "
        "the official harness's verdict on the patch (--set evaluate=true, needs Docker), else 0 with the patch kept"
    ),
    agent="agl_bench.swebench.agent:solve",
    splits=SPLITS,
    train_split="lite-dev",
    eval_split="lite-test",
    metrics=("resolved", "patch_produced"),
    agents=(HARNESS,),
    trainable_agents=(HARNESS,),
    load=load,
    air_rules=air_rules,
    # each rollout clones a repository and runs many model calls; grading one is minutes of Docker
    recommended={"steps": 4, "tasks_per_step": 2, "group_size": 2, "eval_every": 4, "lr": 1e-4},
)
