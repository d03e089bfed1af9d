"""AIR rules of the QuixBugs task.

The repairer makes one LLM call and uses no tool, so there is no intermediate step to reward: no tool span can
fail (`ToolStatusRule` would never fire). What the trace does show is the answer itself, and one without a usable
program is worse than a wrong repair: its tests cannot even run, and the outcome reward (0) cannot tell it from a
program that fails them all. `air:no_program` (−0.5, agl's `AnswerParseRule`) marks such an answer: no Python
that parses and defines a function (`evaluate.parse_program`).
"""

from __future__ import annotations

from agl.learn.air import AirRule, AnswerParseRule
from agl_bench.quixbugs import AGENT_NAME
from agl_bench.quixbugs.evaluate import parse_program


def air_rules() -> tuple[AirRule, ...]:
    return (AnswerParseRule(parse=parse_program, reward=-0.5, agent=AGENT_NAME, name="air:no_program"),)
