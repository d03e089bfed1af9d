"""The range of rewards the server accepts: [-max_abs, max_abs] (`agl serve --max-abs-reward`, 1000 by default).

A reward far outside what any task gives (1e9, posted by an agent that found a way to report its own) would
swamp every advantage of its group and every statistic of its step; it is refused where it comes in (the REST
rewards route, the reward of a completion), with a 400 that names the value and the range, and nothing of its
request is stored. Non-finite values never get this far: the request's validation refuses them (422).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

DEFAULT_MAX_ABS_REWARD = 1000.0


class RewardOutOfRange(ValueError):
    """A reward outside the server's range: answered 400 (the app's handler of ValueError)."""


def check_rewards(values: Iterable[tuple[str, float]], max_abs: float) -> None:
    """Raise `RewardOutOfRange` for the first (what, value) whose value is not finite or outside [-max_abs, max_abs]."""
    for what, value in values:
        if not math.isfinite(value) or abs(value) > max_abs:
            raise RewardOutOfRange(
                f"{what} {value!r} is outside the range this server accepts, [{-max_abs:g}, {max_abs:g}]"
                " (agl serve --max-abs-reward); nothing of this request was stored"
            )
