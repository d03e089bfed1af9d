"""The engines the proxy forwards to, and which one each call goes to (issue #42).

With one engine (one `--upstream`) every call goes there, as always. With several (vLLM servers on several nodes),
a call goes to the engine its attempt used last while that engine is in rotation, so a multi-turn agent keeps
hitting the engine whose prefix cache holds its conversation; an attempt's first call goes to the engine with the
fewest calls in flight (ties in turn). An engine that cannot be reached is taken out of rotation for
`retry_after_s` and then tried again; its calls in flight fail as any upstream failure does (a 502, stored once).
The trainer adds and removes engines as it starts and stops servers (`/api/v1/proxy/engines`).

An engine is operator input, never an agent's: its URL receives every prompt and its answers become training data.
So an engine URL is `http(s)://host[:port]/path` and nothing else (`engine_url`); engines added at run time need the
operator's (or the trainer's admin) token, may be limited to a list of hosts, and get the upstream's API key only
when the operator says so; the proxy refuses calls that come back to itself (`agl.server.proxy`, `VIA_HEADER`).
When an engine fails (unreachable, or its answer fails agl's checks), it leaves rotation for `retry_after_s`; an
attempt moved off its engine returns to it once it is back, so a restarted server gets its attempts back.

Each engine has its own meter (calls in flight, busy seconds, calls answered, tokens generated), beside the
proxy's meter over all of them.
"""

from __future__ import annotations

import ipaddress
import itertools
import logging
import time
import urllib.parse
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from agl.server.call_gate import CallMeter

log = logging.getLogger(__name__)

# attempts whose engine is remembered: the oldest are forgotten first (an attempt is short-lived; a forgotten one
# only loses its affinity)
MAX_AFFINITIES = 100_000


class EngineUrlError(ValueError):
    """An engine URL agl refuses; the message says what is wrong with it."""


def engine_url(url: str) -> str:
    """`url` checked and normalised (no trailing slash): `http(s)://host[:port]/path` with no user name or
    password (they would be sent to the host), no query or fragment, no control characters or spaces, no `.` or `..`
    segment (a path that climbs out of the API's folder on a server that normalises it), and a host."""
    if any(ord(c) < 33 or ord(c) == 127 for c in url):
        raise EngineUrlError(f"engine URL {url[:200]!r} holds a control character or a space")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise EngineUrlError(f"engine URL {url[:200]!r} must start with http:// or https://")
    if "@" in parts.netloc:
        raise EngineUrlError(
            f"engine URL {url[:200]!r} holds a user name or password: give the key with --upstream-api-key"
        )
    if "?" in url or "#" in url:
        raise EngineUrlError(
            f"engine URL {url[:200]!r} has a query or a fragment: an engine is a base URL such as http://host:8000/v1"
        )
    if not parts.hostname:
        raise EngineUrlError(f"engine URL {url[:200]!r} names no host")
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number in 0..65535
    except ValueError as exc:
        raise EngineUrlError(f"engine URL {url[:200]!r} has no valid port ({exc})") from None
    if any(seg in (".", "..") or "%2e" in seg.lower() or "%2f" in seg.lower() for seg in parts.path.split("/")):
        raise EngineUrlError(f"engine URL {url[:200]!r} has a '.' or '..' segment (or an encoded one) in its path")
    return url.rstrip("/")


def link_local(host: str) -> bool:
    """A link-local address (169.254.0.0/16, fe80::/10): where clouds serve instance metadata and credentials."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_link_local
    except ValueError:
        return False


@dataclass
class Engine:
    url: str  # an OpenAI-compatible base URL ending in /v1
    # the upstream's API key goes to engines the operator gave on the command line; one added at run time gets it
    # only when the server was told to send it there (`agl serve --api-key-to-added-engines`)
    gets_api_key: bool = True
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
        # attempt id → (its first engine, the engine it uses now): an attempt moved off a failed engine goes back
        # to its first once that is in rotation again
        self._affinity: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self._turn = itertools.count()
        for url in urls:
            self.add(url)

    @staticmethod
    def _key(url: str) -> str:
        return url.rstrip("/")

    def add(self, url: str, *, gets_api_key: bool = True) -> Engine:
        """Put an engine in rotation (again, if it was out). The URL is checked (`engine_url`)."""
        key = engine_url(url)
        engine = self.engines.get(key)
        if engine is None:
            engine = self.engines[key] = Engine(key, gets_api_key=gets_api_key)
            log.info("engine %s added (%d in all)", key, len(self.engines))
        engine.out_until = 0.0
        return engine

    def remove(self, url: str) -> bool:
        """Take an engine out for good: new calls go elsewhere; its calls in flight finish (or fail) as they are."""
        return self.engines.pop(self._key(url), None) is not None

    @property
    def several(self) -> bool:
        return len(self.engines) > 1

    def pick(self, attempt_id: str, *, avoid: Engine | set[str] | None = None) -> Engine | None:
        """The engine for an attempt's next call: its first one while in rotation, else the one it moved to while
        in rotation, else the least busy; None when there is no engine at all, or none but those in `avoid`
        (engines or their URLs: the ones this call has tried). With every engine out of rotation, the one out
        longest is tried (better a call that may fail than one refused while an engine may be back)."""
        now = time.monotonic()
        first, current = self._affinity.get(attempt_id, ("", ""))
        pinned = self.engines.get(first)
        if avoid is None and pinned is not None and pinned.in_rotation(now):  # the common case, kept cheap
            if current != first:
                self._affinity[attempt_id] = (first, first)
            self._affinity.move_to_end(attempt_id)
            return pinned
        avoided = {avoid.url} if isinstance(avoid, Engine) else set(avoid or ())
        allowed = [e for e in self.engines.values() if e.url not in avoided]
        if not allowed:
            return None
        for url in (first, current):
            pinned = self.engines.get(url)
            if pinned is not None and pinned.url not in avoided and pinned.in_rotation(now):
                self._remember(attempt_id, first or pinned.url, pinned.url)
                return pinned
        candidates = [e for e in allowed if e.in_rotation(now)]
        if not candidates:
            chosen = min(allowed, key=lambda e: e.out_until)
        else:
            low = min(e.meter.in_flight for e in candidates)
            least = [e for e in candidates if e.meter.in_flight == low]
            chosen = least[next(self._turn) % len(least)]
        self._remember(attempt_id, first or chosen.url, chosen.url)
        return chosen

    def _remember(self, attempt_id: str, first: str, current: str) -> None:
        self._affinity[attempt_id] = (first, current)
        self._affinity.move_to_end(attempt_id)
        while len(self._affinity) > MAX_AFFINITIES:
            self._affinity.popitem(last=False)

    def first_in_rotation(self) -> Engine | None:
        """An engine to ask what every engine serves (its models): the first in rotation, else the first at all.
        Unlike `pick`, it routes no call: no attempt's affinity and no turn is taken."""
        now = time.monotonic()
        return next((e for e in self.engines.values() if e.in_rotation(now)), next(iter(self.engines.values()), None))

    def failed(self, engine: Engine, error: str) -> None:
        """The engine could not be reached, or its answer failed agl's checks: out of rotation for `retry_after_s`
        (the first failure is logged)."""
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
