"""One rollout as a tree: attempts, and in each the spans, LLM calls and rewards nested as they happened.

The shape `agl show` prints and the dashboard's rollout page draws: each is only a rendering of these nodes.
Spans nest under their parent span; an LLM call under the span that was open when it was sent; a reward under
the span it names. Anything whose parent is not in the attempt (another process's root span, a lost batch) hangs
at the top, spans in a parent cycle are shown at the top rather than dropped, and spans nested deeper than
`MAX_DEPTH` are shown flat under their ancestor at that depth.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from agl.schema import Attempt, LLMCall, Reward, RolloutDetail, Span

Item = Span | LLMCall | Reward


# Spans nested deeper than this are shown one level below it, in time order: a chain of 1,000 parent spans made
# every renderer (each recursive, as trees are) fail with RecursionError
MAX_DEPTH = 48


@dataclass
class Node:
    item: Item
    children: list[Node] = field(default_factory=list)


@dataclass
class AttemptItems:
    """What one attempt recorded, as stored (not yet nested)."""

    attempt: Attempt
    spans: list[Span] = field(default_factory=list)
    calls: list[LLMCall] = field(default_factory=list)
    rewards: list[Reward] = field(default_factory=list)


def when(item: Item) -> tuple[float, int]:
    if isinstance(item, Span):
        return (item.start_time, 0)
    if isinstance(item, LLMCall):
        return (item.started_at, item.seq)
    return (item.timestamp, 1 << 30)  # at equal times a reward follows the call it rewards


def attempt_of_span(span: Span, attempts: list[Attempt], fallback: str | None) -> str | None:
    """OTLP spans may lack an attempt id: place them by time in the attempt that was running then."""
    if span.attempt_id is not None:
        return span.attempt_id
    for a in attempts:
        if a.started_at <= span.start_time <= (a.ended_at if a.ended_at is not None else float("inf")):
            return a.id
    return fallback


def pick_attempt(detail: RolloutDetail, attempt: str | None = None) -> str | None:
    """The attempt to expand: the one asked for (id or number), else the final one, else the latest."""
    if attempt is not None:
        for a in detail.attempts:
            if attempt in (a.id, str(a.number)):
                return a.id
        known = ", ".join(f"#{a.number} {a.id}" for a in detail.attempts) or "none"
        raise ValueError(f"rollout {detail.rollout.id} has no attempt {attempt!r} (attempts: {known})")
    if detail.rollout.final_attempt_id is not None:
        return detail.rollout.final_attempt_id
    return max(detail.attempts, key=lambda a: a.number).id if detail.attempts else None


def by_attempt(detail: RolloutDetail, shown: str | None) -> list[AttemptItems]:
    """Each attempt (by number) with its spans, calls and rewards; spans without an attempt go by time, else to
    `shown`."""
    parts = {a.id: AttemptItems(a) for a in sorted(detail.attempts, key=lambda a: a.number)}
    for s in detail.spans:
        if (part := parts.get(attempt_of_span(s, detail.attempts, shown) or "")) is not None:
            part.spans.append(s)
    for c in detail.llm_calls:
        if (part := parts.get(c.attempt_id)) is not None:
            part.calls.append(c)
    for r in detail.rewards:
        if (part := parts.get(r.attempt_id)) is not None:
            part.rewards.append(r)
    return list(parts.values())


def nest(spans: list[Span], calls: list[LLMCall], rewards: list[Reward]) -> list[Node]:
    """The top-level nodes of one attempt, children in time order."""
    by_id = {s.span_id: s for s in spans}
    children: dict[str | None, list[Item]] = defaultdict(list)
    for s in spans:
        children[s.parent_id if s.parent_id in by_id and s.parent_id != s.span_id else None].append(s)
    for c in calls:
        children[c.parent_span_id if c.parent_span_id in by_id else None].append(c)
    for r in rewards:
        children[r.span_id if r.span_id in by_id else None].append(r)
    seen: set[str] = set()

    def descendants(span_id: str) -> list[Item]:
        """Everything below a span, flattened (found without recursion)."""
        out: list[Item] = []
        stack = list(children.get(span_id, []))
        while stack:
            item = stack.pop()
            if isinstance(item, Span):
                if item.span_id in seen:
                    continue
                seen.add(item.span_id)
                stack.extend(children.get(item.span_id, []))
            out.append(item)
        return out

    def build(items: Iterable[Item], depth: int) -> list[Node]:
        nodes: list[Node] = []
        for item in sorted(items, key=when):
            if isinstance(item, Span):
                if item.span_id in seen:  # a parent cycle or duplicate id must not recurse forever
                    continue
                seen.add(item.span_id)
                if depth < MAX_DEPTH:
                    nodes.append(Node(item, build(children.get(item.span_id, []), depth + 1)))
                else:
                    flat = [Node(d) for d in sorted(descendants(item.span_id), key=when)]
                    nodes.append(Node(item, flat))
            else:
                nodes.append(Node(item))
        return nodes

    top = build(children[None], 1)
    return top + build([s for s in spans if s.span_id not in seen], 1)
