"""AIR rules of the QuixBugs task.

The repairer makes one LLM call and uses no tool. What its trace shows is the answer itself, and one without a
usable program is worse than a wrong repair: its tests cannot even run, and the outcome reward (0) cannot tell it
from a program that fails them all. `air:no_program` (−0.5, agl's `AnswerParseRule`) marks such an answer: no
Python that parses and defines a function (`evaluate.parse_program`).

Through a coding harness (`--set harness=mini-swe-agent`) the agent runs commands: the harness's own test runs,
edits, reads. Each is recorded as a `bash` tool span from the harness's trajectory (`agl.record_tool_runs`),
and `air:command_failed` (−0.1, agl's `ToolStatusRule`) marks one that exited non-zero — a test run that shows
failures, an edit command that did not apply — right after the model call that asked for it.
"""

from __future__ import annotations

from agl.learn.air import AirRule, AnswerParseRule, ToolStatusRule
from agl_bench.quixbugs import AGENT_NAME
from agl_bench.quixbugs.evaluate import parse_program


def air_rules() -> tuple[AirRule, ...]:
    return (
        AnswerParseRule(parse=parse_program, reward=-0.5, agent=AGENT_NAME, name="air:no_program"),
        ToolStatusRule(error_reward=-0.1, tool="bash", name="air:command_failed"),
    )
