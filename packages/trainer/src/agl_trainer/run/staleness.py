"""Bounded staleness: which calls a step may train on when rollouts of later steps run during updates.

The loop (agl_trainer.run.loop) enqueues step s + K's rollouts when step s starts, while version s serves, so by
construction no call of a step-t rollout comes from a version older than t − K. The filter here checks it on the
calls themselves anyway (the version each call is stored under, which the proxy's gate keeps exact:
agl.server.call_gate): a transition with any token sampled more than K versions before the policy being updated
is dropped and counted, never trained on silently.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from agl.learn.transitions import Transition

UNKNOWN = "unknown"  # a call stored under no version agl published in this run


def stale_reason(max_staleness: int) -> str:
    return f"sampled more than {max_staleness} version(s) before the policy updated"


@dataclass
class Freshness:
    kept: list[Transition]
    # transitions by how many versions older than the updated policy their oldest call is ("0", "1", ..., UNKNOWN)
    histogram: Counter[str] = field(default_factory=Counter)
    dropped: int = 0


def keep_fresh(
    transitions: Sequence[Transition],
    call_versions: Mapping[str, int | None],
    version_steps: Mapping[int, int],
    *,
    updating: int,
    max_staleness: int,
) -> Freshness:
    """The transitions whose every call was sampled by a policy at most `max_staleness` updates before step
    `updating`'s (`call_versions`: call id → stored version; `version_steps`: version → the step it served).
    A transition none of whose calls' versions is known is kept and counted as UNKNOWN."""
    out = Freshness(kept=[])
    for t in transitions:
        versions = [call_versions.get(c) for c in t.call_ids]
        known = [version_steps[v] for v in versions if v is not None and v in version_steps]
        if not known:
            out.histogram[UNKNOWN] += 1
            out.kept.append(t)
            continue
        age = updating - min(known)
        out.histogram[str(age)] += 1
        if age > max_staleness:
            out.dropped += 1
        else:
            out.kept.append(t)
    return out
