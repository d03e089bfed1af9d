"""AIR rules for MuSiQue: a search that found nothing, an answer without the `Answer:` format, a tool that failed.

How an empty retrieval reaches the trace: the agent's `retrieve` tool records, for every search, a
`musique:retrieval` span (kind `retrieval`) with the query, the retriever, the number of hits and the passage
ids; a search with no hits (blank query, only stopwords, no matching word) gets status `error`. The tool itself
still *succeeds* (the model is told "No passages found…" and may search again), so the adapter's `tool:retrieve`
span stays `ok`, and `ToolStatusRule` keeps its meaning: the tool broke (e.g. the embedding endpoint is down).
The two penalties therefore never count the same event twice.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from agl.common.trainable import RolloutView
from agl.learn.air import AirRule, AnswerParseRule, ToolStatusRule, final_attempt_calls, llm_seq_before
from agl.schema import RewardIn, RewardSource
from agl_bench.musique.evaluate import parse_answer

AGENT = "researcher"
RETRIEVAL_SPAN = "musique:retrieval"
RETRIEVAL_KIND = "retrieval"
ATTR_QUERY = "retrieval.query"
ATTR_RETRIEVER = "retrieval.retriever"
ATTR_HITS = "retrieval.hits"
ATTR_PASSAGES = "retrieval.passage_ids"


@dataclass(frozen=True)
class EmptyRetrievalRule:
    """Each search of the final attempt that returned no passage gives `reward`, right after the LLM call that
    asked for it."""

    reward: float = -0.1
    name: str = "air:empty_retrieval"

    def __call__(self, detail: RolloutView) -> Iterable[RewardIn]:
        attempt = detail.rollout.final_attempt_id
        if attempt is None:
            return
        calls = final_attempt_calls(detail)
        for span in detail.spans:
            if span.attempt_id != attempt or span.name != RETRIEVAL_SPAN or span.attributes.get(ATTR_HITS) != 0:
                continue
            yield RewardIn(
                rollout_id=detail.rollout.id,
                attempt_id=attempt,
                value=self.reward,
                name=self.name,
                source=RewardSource.automatic,
                after_llm_seq=llm_seq_before(span, calls),
                span_id=span.span_id,
                agent_name=span.agent_name,
                timestamp=span.end_time,
                uid=f"{self.name}:{span.span_id}",
                metadata={"query": str(span.attributes.get(ATTR_QUERY, ""))[:200]},
            )


def air_rules() -> tuple[AirRule, ...]:
    """Empty searches −0.1 each, a final reply without a readable `Answer:` −0.1, a failed tool call −0.1."""
    return (
        EmptyRetrievalRule(),
        AnswerParseRule(parse=parse_answer, reward=-0.1, agent=AGENT, name="air:unparsable_answer"),
        ToolStatusRule(error_reward=-0.1),
    )
