"""The engines the proxy forwards to, and which one each call goes to (issue #42).

With one engine (one `--upstream`) every call goes there, as always. With several (vLLM servers on several nodes),
a call goes to the engine its attempt used last while that engine is in rotation, so a multi-turn agent keeps
hitting the engine whose prefix cache holds its conversation; an attempt's first call goes to the engine with the
fewest calls in flight (ties in turn). An engine that cannot be reached is taken out of rotation for
`retry_after_s` and then tried again; its calls in flight fail as any upstream failure does (a 502, stored once).
The trainer adds and removes engines as it starts and stops servers (`/api/v1/proxy/engines`).

Each engine has its own meter (calls in flight, busy seconds, calls answered, tokens generated), beside the
proxy's meter over all of them.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from agl.server.call_gate import CallMeter

log = logging.getLogger(__name__)

# attempts whose engine is remembered: the oldest are forgotten first (an attempt is short-lived; a forgotten one
# only loses its affinity)
MAX_AFFINITIES = 100_000


@dataclass
class Engine:
    url: str  # an OpenAI-compatible base URL ending in /v1
    meter: CallMeter = field(default_factory=CallMeter)
    out_until: float = 0.0  # out of rotation until this monotonic time (0: in rotation)
    last_error: str | None = None
    failures: int = 0

    def in_rotation(self, now: float) -> bool:
        return now >= self.out_until

    def usage(self, now: float) -> dict[str, Any]:
        return {
            "url": self.url,
            "in_rotation": self.in_rotation(now),
            "in_flight": self.meter.in_flight,
            "busy_s": self.meter.busy_s,
            "calls": self.meter.calls,
            "completion_tokens": self.meter.completion_tokens,
            "failures": self.failures,
            "last_error": self.last_error,
        }


class EngineRouter:
    def __init__(self, urls: list[str], *, retry_after_s: float = 10.0) -> None:
        self.engines: dict[str, Engine] = {}
        self.retry_after_s = retry_after_s
        self._affinity: OrderedDict[str, str] = OrderedDict()  # attempt id → engine url
        self._turn = itertools.count()
        for url in urls:
            self.add(url)

    @staticmethod
    def _key(url: str) -> str:
        return url.rstrip("/")

    def add(self, url: str) -> Engine:
        """Put an engine in rotation (again, if it was out)."""
        key = self._key(url)
        engine = self.engines.get(key)
        if engine is None:
            engine = self.engines[key] = Engine(key)
            log.info("engine %s added (%d in all)", key, len(self.engines))
        engine.out_until = 0.0
        return engine

    def remove(self, url: str) -> bool:
        """Take an engine out for good: new calls go elsewhere; its calls in flight finish (or fail) as they are."""
        return self.engines.pop(self._key(url), None) is not None

    @property
    def several(self) -> bool:
        return len(self.engines) > 1

    def pick(self, attempt_id: str, *, avoid: Engine | None = None) -> Engine | None:
        """The engine for an attempt's next call: its last one while in rotation, else the least busy; None when
        there is no engine at all. With every engine out of rotation, the one out longest is tried (better a call
        that may fail than one refused while an engine may be back)."""
        if not self.engines:
            return None
        now = time.monotonic()
        pinned = self.engines.get(self._affinity.get(attempt_id, ""))
        if pinned is not None and pinned is not avoid and pinned.in_rotation(now):
            self._affinity.move_to_end(attempt_id)
            return pinned
        candidates = [e for e in self.engines.values() if e is not avoid and e.in_rotation(now)]
        if not candidates:
            others = [e for e in self.engines.values() if e is not avoid] or list(self.engines.values())
            chosen = min(others, key=lambda e: e.out_until)
        else:
            low = min(e.meter.in_flight for e in candidates)
            least = [e for e in candidates if e.meter.in_flight == low]
            chosen = least[next(self._turn) % len(least)]
        self._affinity[attempt_id] = chosen.url
        self._affinity.move_to_end(attempt_id)
        while len(self._affinity) > MAX_AFFINITIES:
            self._affinity.popitem(last=False)
        return chosen

    def first_in_rotation(self) -> Engine | None:
        """An engine to ask what every engine serves (its models): the first in rotation, else the first at all.
        Unlike `pick`, it routes no call: no attempt's affinity and no turn is taken."""
        now = time.monotonic()
        return next((e for e in self.engines.values() if e.in_rotation(now)), next(iter(self.engines.values()), None))

    def failed(self, engine: Engine, error: str) -> None:
        """The engine could not be reached: out of rotation for `retry_after_s` (the first failure is logged)."""
        if engine.in_rotation(time.monotonic()):
            log.warning(
                "engine %s failed (%s): out of rotation for %g s%s",
                engine.url,
                error,
                self.retry_after_s,
                "" if self.several else " (it is the only one)",
            )
        engine.failures += 1
        engine.last_error = error
        engine.out_until = time.monotonic() + self.retry_after_s

    def answered(self, engine: Engine) -> None:
        engine.out_until = 0.0

    def usage(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        return [e.usage(now) for e in self.engines.values()]
