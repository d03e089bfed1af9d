"""What is running right now: the rollout, the acting agent and the open span, held in context variables.

Context variables follow the code that runs: each asyncio task, and each thread, sees its own values, so two
agents working at the same time in two threads or two tasks never see each other's names. A thread started by
hand does not inherit them (Python's rule); `asyncio.to_thread`, `contextvars.copy_context().run` and
`agl.propagate(fn)` carry them over.
"""

from __future__ import annotations

import contextvars
import functools
import secrets
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ParamSpec, TypeVar

from agl.schema import RewardIn, SpanIn

P = ParamSpec("P")
R = TypeVar("R")


def new_trace_id() -> str:
    return secrets.token_hex(16)


def new_span_id() -> str:
    return secrets.token_hex(8)


@dataclass
class Recorder:
    """Spans and rewards made during one attempt, waiting to be sent; the runner drains it."""

    spans: list[SpanIn] = field(default_factory=list)
    rewards: list[RewardIn] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add_span(self, span: SpanIn) -> None:
        with self._lock:
            self.spans.append(span)

    def add_reward(self, reward: RewardIn) -> None:
        with self._lock:
            self.rewards.append(reward)

    def drain(self) -> tuple[list[SpanIn], list[RewardIn]]:
        with self._lock:
            spans, rewards = self.spans, self.rewards
            self.spans, self.rewards = [], []
        return spans, rewards


@dataclass
class RolloutContext:
    """The rollout an agent is working on; set by the runner for the duration of one attempt."""

    rollout_id: str
    attempt_id: str
    server_url: str
    # the attempt's own API key for a server with a token (see agl.server.credentials); requests for the fixed
    # LLM URL carry it whatever key the client was built with
    credential: str | None = None
    trace_id: str = field(default_factory=new_trace_id)
    recorder: Recorder = field(default_factory=Recorder)
    # Highest sequence number the proxy gave an LLM call of this attempt that has answered; rewards are
    # placed after it, which is exact even when spans and rewards are sent later in batches.
    last_llm_seq: int | None = None
    # Agent scopes opened during the attempt: with any, a call that reaches the proxy without agl's hook header
    # lost the agent name it should have carried (see agl.capture.tracing.http_inject).
    agent_scopes: int = 0
    # spans or rewards the server refused for good (bad input): the attempt reports them as its failure
    refused: list[str] = field(default_factory=list)
    # LLM requests the agent sent to another host than agl (agl.capture.tracing.http_inject): answered, never recorded;
    # and those to LLMs it named its own (`external_llm`, the allow-list), counted apart
    bypassed_llm_calls: int = 0
    bypassed_llm_url: str | None = None
    external_llm_calls: int = 0
    # LLM requests sent to agl through a patched client, and those of them that carried no agent name: all of them
    # unnamed while a framework hook is in place means agents cannot be selected (the runner says so)
    bypass_outcomes: Counter[str] = field(default_factory=Counter)  # "answered" / "refused" / "unreached"
    llm_calls_sent: int = 0
    llm_calls_unnamed: int = 0
    llm_call_agents: Counter[str] = field(default_factory=Counter)  # the agent names the named ones carried
    # spans a span-reading hook (agl_otel) saw start in this rollout, by name: what the runner names when no call
    # got an agent name
    framework_spans: Counter[str] = field(default_factory=Counter)
    _seq_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def llm_base_url(self) -> str:
        return llm_base_url(self.server_url, self.rollout_id, self.attempt_id)

    @property
    def fixed_llm_base_url(self) -> str:
        """The run's one LLM URL: calls there are attributed by headers added at send time (agl.capture.tracing.http_inject)."""
        return fixed_llm_base_url(self.server_url)

    def saw_llm_seq(self, seq: int) -> None:
        with self._seq_lock:
            if self.last_llm_seq is None or seq > self.last_llm_seq:
                self.last_llm_seq = seq

    def opened_agent_scope(self) -> None:
        with self._seq_lock:
            self.agent_scopes += 1

    def elsewhere(self) -> tuple[int, str | None, int, int, int]:
        """What the agent sent elsewhere than agl (agl.store.lifecycle.Elsewhere), for the attempt's report."""
        with self._seq_lock:
            answered, refused = self.bypass_outcomes["answered"], self.bypass_outcomes["refused"]
            return (self.bypassed_llm_calls, self.bypassed_llm_url, self.external_llm_calls, answered, refused)

    def bypass_answered(self, status: int | None) -> None:
        """What became of a call that bypassed agl: its HTTP status, None when it reached no server."""
        outcome = "unreached" if status is None else "answered" if status < 400 else "refused"
        with self._seq_lock:
            self.bypass_outcomes[outcome] += 1

    def sent_llm_call(self, *, agent: str | None) -> None:
        with self._seq_lock:
            self.llm_calls_sent += 1
            if agent is None:
                self.llm_calls_unnamed += 1
            elif agent in self.llm_call_agents or len(self.llm_call_agents) < 256:  # bounded: names, not calls
                self.llm_call_agents[agent] += 1

    def saw_framework_span(self, name: str) -> None:
        with self._seq_lock:
            if name in self.framework_spans or len(self.framework_spans) < 256:  # bounded: names, not spans
                self.framework_spans[name] += 1

    def sent_llm_call_elsewhere(self, url: str, *, intended: bool) -> None:
        with self._seq_lock:
            if intended:
                self.external_llm_calls += 1
            else:
                self.bypassed_llm_calls += 1
                if self.bypassed_llm_url is None:
                    self.bypassed_llm_url = url


def llm_base_url(server_url: str, rollout_id: str, attempt_id: str) -> str:
    """The OpenAI base URL of one attempt: every framework keeps a path prefix, so the ids travel in it."""
    return f"{server_url.rstrip('/')}/rollout/{rollout_id}/attempt/{attempt_id}/v1"


def fixed_llm_base_url(server_url: str) -> str:
    """The OpenAI base URL that serves every rollout of a run; for clients built once, at import time."""
    return f"{server_url.rstrip('/')}/v1"


_rollout: contextvars.ContextVar[RolloutContext | None] = contextvars.ContextVar("agl_rollout", default=None)
# (name, key): the acting agent's name and, where a framework has one, a stable second name (see `enter_agent`)
_agent: contextvars.ContextVar[tuple[str, str | None] | None] = contextvars.ContextVar("agl_agent", default=None)
_span: contextvars.ContextVar[str | None] = contextvars.ContextVar("agl_span", default=None)


def current_rollout() -> RolloutContext | None:
    """The rollout this code runs in, or None outside any rollout."""
    return _rollout.get()


_external_llm: contextvars.ContextVar[bool] = contextvars.ContextVar("agl_external_llm", default=False)
_external_hosts: set[str] = set()


class external_llm:
    """Marks the LLM calls made inside as going to another model on purpose (a hosted judge, a tool backed by its
    own LLM): counted apart, never reported as calls that bypassed agl. Works in sync and async code."""

    def __enter__(self) -> None:
        self._token = _external_llm.set(True)

    def __exit__(self, *exc: object) -> None:
        _external_llm.reset(self._token)


def allow_external_llm(*hosts: str) -> None:
    """Hosts (`api.openai.com`, `judge.internal:8000`) whose LLM calls are intended: counted apart, never reported
    as bypassing agl. `AGL_EXTERNAL_LLM_HOSTS` (comma-separated) adds to them."""
    _external_hosts.update(h.strip().lower() for h in hosts if h.strip())


def external_llm_intended(host: str, port: int | None) -> bool:
    """Whether an LLM call to `host` (and `port`) leaves agl on purpose (`external_llm`, the allow-list)."""
    if _external_llm.get():
        return True
    import os

    allowed = _external_hosts | {
        h.strip().lower() for h in os.environ.get("AGL_EXTERNAL_LLM_HOSTS", "").split(",") if h.strip()
    }
    host = host.lower()
    return host in allowed or (port is not None and f"{host}:{port}" in allowed)


# Where the acting agent comes from when no agl scope is open: a framework's own runtime state, read at the moment
# a call is made (agl_otel registers them for instrumentors that name the agent only when its span ends).
AgentResolver = Callable[[], tuple[str, str | None] | None]
_resolvers: list[AgentResolver] = []


def add_agent_resolver(resolver: AgentResolver) -> None:
    """Consult `resolver()` (→ (name, key) or None) for the acting agent wherever no agent scope is open; it must be
    cheap and never raise. Added once, however often called."""
    if resolver not in _resolvers:
        _resolvers.append(resolver)


def remove_agent_resolver(resolver: AgentResolver) -> None:
    if resolver in _resolvers:
        _resolvers.remove(resolver)


def _acting() -> tuple[str, str | None] | None:
    acting = _agent.get()
    if acting is not None or not _resolvers:
        return acting
    for resolver in _resolvers:
        try:
            found = resolver()
        except Exception:  # a framework's internals changed under it: no name, never a failed call
            continue
        if found is not None and found[0]:
            return found
    return None


def current_agent() -> str | None:
    """The name of the agent scope this code runs in (else what a registered resolver says), or None."""
    acting = _acting()
    return None if acting is None else acting[0]


def current_agent_key() -> str | None:
    """The stable second name of the acting agent, if its scope gave one."""
    acting = _acting()
    return None if acting is None else acting[1]


def current_span_id() -> str | None:
    return _span.get()


AgentToken = contextvars.Token[tuple[str, str | None] | None]


def enter_agent(name: str, key: str | None = None) -> AgentToken:
    """Make `name` the acting agent in this context until `exit_agent(token)`: for framework hooks that see an
    agent step begin and end as two callbacks run in the same context (`agl.agent` is the `with` form).

    `key`: a second name that stays the same where `name` does not, e.g. a CrewAI role before its `{topic}` is
    filled in; stored beside the name, and training selection matches either."""
    if not name:
        raise ValueError("agent name must be a non-empty string")
    ctx = _rollout.get()
    if ctx is not None:
        ctx.opened_agent_scope()
    return _agent.set((name, key or None))


def exit_agent(token: AgentToken) -> None:
    """Undo `enter_agent`; a token from another context (a hook that ended elsewhere) is ignored safely."""
    try:
        _agent.reset(token)
    except ValueError:  # created in a different context: that context's value dies with it
        pass


def propagate(fn: Callable[P, R]) -> Callable[P, R]:
    """Wrap `fn` so that it runs with the caller's rollout, agent and span, e.g. in a thread it starts."""
    ctx = contextvars.copy_context()

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        return ctx.copy().run(fn, *args, **kwargs)

    return run


def set_rollout(ctx: RolloutContext | None) -> contextvars.Token[RolloutContext | None]:
    return _rollout.set(ctx)


def reset_rollout(token: contextvars.Token[RolloutContext | None]) -> None:
    _rollout.reset(token)


AGENT_VAR = _agent
SPAN_VAR = _span
