"""AIR rules of the Calc-X task: intermediate rewards read from the stored trace.

- `air:calculator_error` (−0.1): a calculator call that failed (the tool span the AutoGen adapter records with
  status `error`), placed right after the LLM call that asked for it. Only the calculator's spans count, so a
  tool another layer records cannot be charged to the solver.
- `air:unparsable_answer` (−0.5): the solver's last answer holds no number or option letter that
  `evaluate.parse_answer` can read.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from agl.air import AirRule, AnswerParseRule, ToolStatusRule
from agl.schema import RewardIn, RolloutDetail, Span
from agl.tracing import attributes as attr
from agl_bench.calc_x import AGENT_NAME, TOOL_NAME
from agl_bench.calc_x.evaluate import parse_answer


def is_calculator_span(span: Span) -> bool:
    return span.attributes.get(attr.TOOL_NAME) == TOOL_NAME or span.name == f"tool:{TOOL_NAME}"


@dataclass(frozen=True)
class CalculatorErrorRule:
    """agl's ToolStatusRule, applied to the calculator's spans only."""

    error_reward: float = -0.1
    name: str = "air:calculator_error"

    def __call__(self, detail: RolloutDetail) -> Iterable[RewardIn]:
        calculator_only = detail.model_copy(update={"spans": [s for s in detail.spans if is_calculator_span(s)]})
        return ToolStatusRule(error_reward=self.error_reward, ok_reward=0.0, name=self.name)(calculator_only)


def air_rules() -> tuple[AirRule, ...]:
    return (CalculatorErrorRule(), AnswerParseRule(parse=parse_answer, agent=AGENT_NAME))
