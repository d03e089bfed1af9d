"""AIR rules for Spider: intermediate rewards from what the trace already shows.

- `air:sql_error` (−0.1; agl's `ToolStatusRule` limited to `execute_sql`): a query span that ended in error
  (the query failed to prepare or run, or timed out), placed right after the LLM call that wrote the query.
  Other tool spans are ignored: only a failed query says the SQL was bad.
- `NoSqlRule` (`air:no_sql`, −0.2): a writer or rewriter answer in which no SQL statement can be found. Such an
  answer never reaches the database, so the SQL rule cannot see it; it is worse than a query that fails.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from agl.common.trainable import RolloutView
from agl.learn.air import AirRule, ToolStatusRule, final_attempt_calls
from agl.schema import RewardIn, RewardSource
from agl_bench.spider.evaluate import extract_sql

SQL_TOOL = "execute_sql"  # the tool span the agent records for each query it runs


@dataclass(frozen=True)
class NoSqlRule:
    reward: float = -0.2
    agents: tuple[str, ...] = ("writer", "rewriter")
    name: str = "air:no_sql"

    def __call__(self, detail: RolloutView) -> Iterable[RewardIn]:
        for call in final_attempt_calls(detail):
            if call.agent_name not in self.agents or call.response_message is None:
                continue
            content = call.response_message.get("content")
            text = content if isinstance(content, str) else ""
            if extract_sql(text) is not None:
                continue
            yield RewardIn(
                rollout_id=detail.rollout.id,
                attempt_id=call.attempt_id,
                value=self.reward,
                name=self.name,
                source=RewardSource.automatic,
                after_llm_seq=call.seq,
                agent_name=call.agent_name,
                timestamp=call.started_at + call.latency_s,
                uid=f"{self.name}:{call.id}",
                metadata={"answer": text[:200]},
            )


def air_rules() -> tuple[AirRule, ...]:
    # only a failed query says the SQL was bad: other tool spans are not this rule's business
    return (ToolStatusRule(error_reward=-0.1, tool=SQL_TOOL, name="air:sql_error"), NoSqlRule())
