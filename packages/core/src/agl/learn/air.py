"""Automatic Intermediate Rewarding (AIR): rules that read runtime signals already in a rollout's trace and
turn them into intermediate rewards, so that a long run teaches more than its final score.

A rule is any callable `RolloutView → iterable of RewardIn` (a `RolloutDetail`, or the `TrainableRollout` the
trainer reads: the same attributes, see agl.common.trainable); the built-in ones:

- `ToolStatusRule`: a tool span that ended in error gives `error_reward` (default −0.1) right after the LLM call
  that asked for the tool; one that succeeded gives `ok_reward` (default 0: rewarding every tool call invites
  calling tools for their own sake); `tool=` limits it to one tool's spans. Tool spans are those of kind `tool` (agl's `agl.tool(...)`, the adapters)
  or carrying `gen_ai.tool.name` (OpenTelemetry GenAI instrumentations).
- `AnswerParseRule`: the last answer of an agent that the task's parser cannot read gives `reward`
  (default −0.5).

Every reward a rule makes has source `automatic`, the rule's name, and a `uid` derived from what it is about,
so applying the rules twice, or storing their rewards twice, counts them once. `DEFAULT_RULES` is what the
trainer uses unless told otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from agl.common import attributes as attr
from agl.common.trainable import CallView, RolloutView
from agl.schema import Reward, RewardIn, RewardSource, Span, SpanStatus

V = TypeVar("V", bound=RolloutView)


class AirRule(Protocol):
    @property
    def name(self) -> str: ...

    def __call__(self, detail: RolloutView) -> Iterable[RewardIn]: ...


def final_attempt_calls(detail: RolloutView) -> list[CallView]:
    attempt = detail.rollout.final_attempt_id
    return sorted((c for c in detail.llm_calls if c.attempt_id == attempt), key=lambda c: c.seq)


def llm_seq_before(span: Span, calls: Sequence[CallView]) -> int | None:
    """The call a span came after: the call that asked for it when the span says which (`_call_that_asked`), else
    the span's own record of the last call answered, else the last call that had answered when the span started
    (spans from other tracers carry only times)."""
    asked = _call_that_asked(span, calls)
    if asked is not None:
        return asked
    recorded = span.attributes.get(attr.AFTER_LLM_SEQ)
    if isinstance(recorded, int):
        return recorded
    answered = [c.seq for c in calls if c.started_at + c.latency_s <= span.start_time]
    return max(answered) if answered else None


def _call_that_asked(span: Span, calls: Sequence[CallView]) -> int | None:
    """The seq of the call whose answer asked for the tool run `span` records, where the span names it: by the tool
    call's id, or by its order among its agent's calls of the tools it lists (a harness whose report gives no id;
    agl.capture.tool_runs), or among all its agent's calls when it lists none (a harness that calls no tools, as
    Aider, whose runs follow its answers). A harness's runs are recorded after it ended, when their times no longer
    tell."""
    ordered = sorted(calls, key=lambda c: c.seq)
    call_id = span.attributes.get(attr.TOOL_CALL_ID)
    if isinstance(call_id, str):
        return next((c.seq for c in ordered for t in _tool_calls(c) if t.get("id") == call_id), None)
    ordinal, listed = span.attributes.get(attr.TOOL_CALL_ORDINAL), span.attributes.get(attr.TOOL_CALL_ORDINAL_OF)
    if not isinstance(ordinal, int) or not isinstance(listed, list):
        return None
    if not listed:  # a harness that calls no tools (Aider edits by text): its order among all of its agent's calls
        asking = [c.seq for c in ordered if c.agent_name == span.agent_name]
    else:
        asking = [
            c.seq for c in ordered if c.agent_name == span.agent_name for t in _tool_calls(c) if _name(t) in listed
        ]
    return asking[ordinal] if 0 <= ordinal < len(asking) else None


def _name(tool_call: dict[str, Any]) -> str | None:
    function = tool_call.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else None


def _tool_calls(call: CallView) -> list[dict[str, Any]]:
    message = call.response_message
    tool_calls = message.get("tool_calls") if message is not None else None
    return [t for t in tool_calls if isinstance(t, dict)] if isinstance(tool_calls, list) else []


def is_tool_span(span: Span) -> bool:
    return span.attributes.get(attr.SPAN_KIND) == "tool" or attr.TOOL_NAME in span.attributes


@dataclass(frozen=True)
class ToolStatusRule:
    error_reward: float = -0.1
    ok_reward: float = 0.0
    name: str = "air:tool_status"
    tool: str | None = None  # only this tool's spans (e.g. a task's `execute_sql`); None: every tool

    def __call__(self, detail: RolloutView) -> Iterable[RewardIn]:
        attempt = detail.rollout.final_attempt_id
        if attempt is None:
            return
        calls = final_attempt_calls(detail)
        for span in detail.spans:
            if span.attempt_id != attempt or not is_tool_span(span):
                continue
            if self.tool is not None and span.attributes.get(attr.TOOL_NAME) != self.tool:
                continue
            if span.status is SpanStatus.error:
                value, outcome = self.error_reward, "error"
            elif span.status is SpanStatus.ok:
                value, outcome = self.ok_reward, "ok"
            else:
                continue
            if value == 0.0:
                continue
            yield RewardIn(
                rollout_id=detail.rollout.id,
                attempt_id=attempt,
                value=value,
                name=self.name,
                source=RewardSource.automatic,
                after_llm_seq=llm_seq_before(span, calls),
                span_id=span.span_id,
                agent_name=span.agent_name,
                timestamp=span.end_time,
                uid=f"{self.name}:{span.span_id}",
                metadata={
                    "tool": str(span.attributes.get(attr.TOOL_NAME, span.name)),
                    "outcome": outcome,
                    "message": span.status_message,
                },
            )


@dataclass(frozen=True)
class AnswerParseRule:
    """`parse(text)` returns None or raises when the answer cannot be read (e.g. no number, no SQL)."""

    parse: Callable[[str], Any]
    reward: float = -0.5
    agent: str | None = None  # whose last answer to check; None: the last call of the rollout
    name: str = "air:unparsable_answer"

    def __call__(self, detail: RolloutView) -> Iterable[RewardIn]:
        calls = [c for c in final_attempt_calls(detail) if self.agent is None or c.agent_name == self.agent]
        if not calls:
            return
        last = calls[-1]
        message = last.response_message
        if message is None:
            return
        content = message.get("content")
        text = content if isinstance(content, str) else ""
        try:
            readable = self.parse(text) is not None
        except Exception:
            readable = False
        if not readable:
            yield RewardIn(
                rollout_id=detail.rollout.id,
                attempt_id=last.attempt_id,
                value=self.reward,
                name=self.name,
                source=RewardSource.automatic,
                after_llm_seq=last.seq,
                agent_name=last.agent_name,
                timestamp=last.started_at + last.latency_s,
                uid=f"{self.name}:{last.id}",
                metadata={"answer": text[:200]},
            )


DEFAULT_RULES: tuple[AirRule, ...] = (ToolStatusRule(),)


def air_rewards(detail: RolloutView, rules: Sequence[AirRule] = DEFAULT_RULES) -> list[RewardIn]:
    """The automatic rewards of one rollout that are not stored yet (matched by uid)."""
    stored = {r.uid for r in detail.rewards if r.uid}
    out: list[RewardIn] = []
    for rule in rules:
        out += [r for r in rule(detail) if r.uid not in stored]
    return out


def with_rewards_added(detail: V, new: Sequence[RewardIn]) -> V:
    """A copy of `detail` whose rewards also hold `new` (rewards not stored yet, such as `air_rewards`' answer),
    numbered after the stored ones."""
    if not new:
        return detail
    next_id = max((r.id for r in detail.rewards), default=0) + 1
    added = [Reward(id=next_id + i, **{**r.model_dump(), "timestamp": r.timestamp or 0.0}) for i, r in enumerate(new)]
    return detail.with_rewards([*detail.rewards, *added])


def with_air(detail: V, rules: Sequence[AirRule] = DEFAULT_RULES) -> V:
    """A copy of `detail` whose rewards include the rules' automatic rewards (each once)."""
    return with_rewards_added(detail, air_rewards(detail, rules))
