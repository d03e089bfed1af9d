"""How a benchmark agent reports its outcome, and how the harness reads it back from the stored trace.

The rollout function returns the task's primary metric (its reward); `report` also stores every metric and the
prediction in a `bench:result` span, so `agl bench eval` can print EM and F1 (or more) from the store alone.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import agl
from agl.schema import RolloutDetail

RESULT_SPAN = "bench:result"
_MAX_TEXT = 4000


def report(metrics: Mapping[str, float], *, prediction: str | None, gold: str | None = None, **info: Any) -> None:
    """Record the outcome of this rollout (a no-op outside one)."""
    now = time.time()
    attributes: dict[str, Any] = {"bench.metrics": json.dumps({k: float(v) for k, v in metrics.items()})}
    if prediction is not None:
        attributes["bench.prediction"] = prediction[:_MAX_TEXT]
    if gold is not None:
        attributes["bench.gold"] = gold[:_MAX_TEXT]
    if info:
        attributes["bench.info"] = json.dumps(info, default=str)[:_MAX_TEXT]
    agl.record_span(RESULT_SPAN, kind="bench_result", start_time=now, end_time=now, attributes=attributes)


@dataclass(frozen=True)
class Outcome:
    metrics: dict[str, float]
    prediction: str | None
    gold: str | None
    info: dict[str, Any]


def read_outcome(detail: RolloutDetail) -> Outcome | None:
    """The outcome the final attempt reported, or None (the rollout failed before reporting)."""
    attempt = detail.rollout.final_attempt_id
    for span in reversed(detail.spans):
        if span.name != RESULT_SPAN or span.attempt_id != attempt:
            continue
        attrs = span.attributes
        info = attrs.get("bench.info")
        return Outcome(
            metrics={k: float(v) for k, v in json.loads(str(attrs.get("bench.metrics", "{}"))).items()},
            prediction=_text(attrs.get("bench.prediction")),
            gold=_text(attrs.get("bench.gold")),
            info=json.loads(info) if isinstance(info, str) else {},
        )
    return None


def _text(value: object) -> str | None:
    return None if value is None else str(value)
