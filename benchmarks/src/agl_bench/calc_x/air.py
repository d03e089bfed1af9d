"""AIR rules of the Calc-X task: intermediate rewards read from the stored trace.

- `air:calculator_error` (−0.1): a calculator call that failed (the tool span the AutoGen adapter records with
  status `error`), placed right after the LLM call that asked for it. Only the calculator's spans count, so a
  tool another layer records cannot be charged to the solver.
- `air:unparsable_answer` (−0.5): the solver's last answer holds no number or option letter that
  `evaluate.parse_answer` can read.
"""

from __future__ import annotations

from agl.learn.air import AirRule, AnswerParseRule, ToolStatusRule
from agl_bench.calc_x import AGENT_NAME, TOOL_NAME
from agl_bench.calc_x.evaluate import parse_answer


def air_rules() -> tuple[AirRule, ...]:
    return (
        ToolStatusRule(error_reward=-0.1, tool=TOOL_NAME, name="air:calculator_error"),
        AnswerParseRule(parse=parse_answer, agent=AGENT_NAME),
    )
