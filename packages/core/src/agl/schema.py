"""The records agl stores: tasks, rollouts, attempts, spans, LLM calls, rewards, model versions.

Everything that crosses a process boundary is one of these pydantic models, so the REST API, the store and
the trainer agree on one shape. Floats that carry rewards refuse NaN and infinity: a NaN reward silently
poisons every advantage it is averaged into.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, JsonValue, field_validator

# SQLite stores integers in 64 bits and orjson writes JSON integers of at most 64 bits: a bigger one would fail
# deep in the store (a 500, and a worker retrying for minutes). They are refused at the API edge instead.
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
# Unix seconds; anything past the year 5000 is a unit mistake (nanoseconds sent as seconds) or nonsense.
MAX_TIMESTAMP = 1e11


def _json_fits(value: JsonValue) -> JsonValue:
    """Refuse integers that do not fit in 64 bits anywhere inside a JSON value."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, bool) or item is None:
            continue
        if isinstance(item, int) and not INT64_MIN <= item <= INT64_MAX:
            digits = str(item)
            shown = digits if len(digits) <= 30 else digits[:30] + "…"
            raise ValueError(f"integer {shown} does not fit in 64 bits" + (f" (at {path})" if path else ""))
        if isinstance(item, dict):
            stack.extend((f"{path}.{k}" if path else str(k), v) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(item))
    return value


def _not_bool(value: Any) -> Any:
    # pydantic turns true into 1.0 for a float field; a reward of `true` is a mistake, not a 1
    if isinstance(value, bool):
        raise ValueError("must be a number, not a boolean")
    return value


Json = Annotated[JsonValue, AfterValidator(_json_fits)]
Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
Seq = Annotated[int, Field(ge=0, le=INT64_MAX)]
Number = Annotated[float, BeforeValidator(_not_bool)]
Timestamp = Annotated[float, BeforeValidator(_not_bool), Field(ge=0, le=MAX_TIMESTAMP)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class RolloutStatus(str, enum.Enum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (RolloutStatus.succeeded, RolloutStatus.failed, RolloutStatus.cancelled)


class AttemptStatus(str, enum.Enum):
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    timeout = "timeout"
    lost = "lost"  # lease expired: the worker stopped heartbeating (killed, hung or partitioned)

    @property
    def terminal(self) -> bool:
        return self is not AttemptStatus.running


class RewardSource(str, enum.Enum):
    explicit = "explicit"  # agl.emit_reward(...)
    returned = "returned"  # the agent function returned a float
    automatic = "automatic"  # created by an AIR rule from runtime signals


class SpanStatus(str, enum.Enum):
    unset = "unset"
    ok = "ok"
    error = "error"


class Attribution(str, enum.Enum):
    scope = "scope"  # the call arrived inside an agent scope that named its agent
    unattributed = "unattributed"  # no agent scope was active: stored, flagged, never guessed
    # The request did not pass through agl's HTTP hook (an HTTP client agl does not patch), so no agent could
    # be named; it becomes `missed` when its attempt turns out to have opened agent scopes.
    unhooked = "unhooked"
    # Its attempt opened agent scopes, but the call came through an unpatched client: its agent name was lost.
    missed = "missed"

    @property
    def lost(self) -> bool:
        """The agent name should have been there: counted and warned about everywhere."""
        return self is Attribution.missed


# ----------------------------------------------------------------------------------------------- tasks


class TaskIn(_Model):
    input: Json
    id: str | None = Field(default=None, min_length=1, max_length=200)
    metadata: dict[str, Json] = Field(default_factory=dict)


class Task(_Model):
    id: str
    input: JsonValue
    metadata: dict[str, JsonValue]
    created_at: float


# -------------------------------------------------------------------------------------------- rollouts


class EnqueueRequest(_Model):
    """Ask for `n` rollouts of one task (an existing `task_id`, or a new `task`)."""

    task_id: str | None = None
    task: TaskIn | None = None
    n: int = Field(default=1, ge=1, le=10_000)
    mode: Literal["train", "eval"] = "train"
    step: Seq | None = None
    max_attempts: int = Field(default=3, ge=1, le=100)
    # at least 1 ms: 1e-300 passed `gt=0` and timed every attempt out before it started
    timeout_s: float | None = Field(default=None, ge=0.001, le=10 * 365 * 86400)
    metadata: dict[str, Json] = Field(default_factory=dict)


class Rollout(_Model):
    id: str
    task_id: str
    mode: Literal["train", "eval"]
    step: int | None
    status: RolloutStatus
    attempt_count: int
    max_attempts: int
    timeout_s: float | None
    created_at: float
    started_at: float | None
    ended_at: float | None
    final_attempt_id: str | None
    final_reward: float | None
    error: str | None
    metadata: dict[str, JsonValue]
    # LLM calls the latest reported attempt sent somewhere other than agl (agl.capture.tracing.http_inject): answered,
    # never recorded. Last, as its store column is.
    bypassed_llm_calls: int = 0


ALL_BYPASSED = "every LLM call bypassed agl"  # a rollout whose calls all went elsewhere: nothing recorded


def all_bypassed(rollout: Rollout, recorded_calls: int) -> bool:
    """Whether every LLM call of the rollout's latest attempt went elsewhere than agl (none recorded)."""
    return rollout.bypassed_llm_calls > 0 and recorded_calls == 0


class Attempt(_Model):
    id: str
    rollout_id: str
    number: int
    worker_id: str
    status: AttemptStatus
    started_at: float
    heartbeat_at: float
    lease_expires_at: float
    ended_at: float | None
    error: str | None
    # what the attempt's agent sent to LLMs other than agl (agl.capture.tracing.http_inject), as its runner reported it:
    # calls that bypassed agl (the first one's URL), and calls to LLMs it named as its own (`agl.external_llm`)
    bypassed_llm_calls: int = 0
    bypassed_llm_url: str | None = None
    external_llm_calls: int = 0
    # of the bypassed calls, those answered there (never recorded) and those refused (an HTTP error); the rest never
    # reached a server. None: not reported (an older runner)
    bypassed_llm_answered: int | None = None
    bypassed_llm_refused: int | None = None

    def bypass_story(self) -> str:
        return bypass_story(self.bypassed_llm_calls, self.bypassed_llm_answered, self.bypassed_llm_refused)


def bypass_story(calls: int, answered: int | None, refused: int | None) -> str:
    """What became of the calls that bypassed agl, in words: "3 answered there, never recorded; 1 refused (an HTTP
    error)"; answered and refused None: not reported (an older runner)."""
    if answered is None or refused is None:
        return "answered or not, never recorded"
    unreached = calls - answered - refused
    parts = [
        f"{answered} answered there, never recorded" if answered else "",
        f"{refused} refused (an HTTP error)" if refused else "",
        f"{unreached} reached no server" if unreached > 0 else "",
    ]
    return "; ".join(p for p in parts if p)


class ClaimRequest(_Model):
    worker_id: str = Field(min_length=1, max_length=200)
    max_rollouts: int = Field(default=1, ge=1, le=1000)
    lease_s: float = Field(default=30.0, gt=0, le=3600)
    wait_s: float = Field(default=0.0, ge=0, le=60)


class Claim(_Model):
    rollout: Rollout
    attempt: Attempt
    task: Task
    # with a server token (agl.server.credentials): the attempt credential, which opens this attempt's proxy URL
    # and its own reports (rewards, spans, heartbeat, completion); kept for older workers, never given to the agent
    credential: str | None = None
    # with a server token: the LLM credential, which opens this attempt's LLM routes and nothing else; the agent's
    # API key (and that of every program it runs), instead of the operator token or the attempt credential
    llm_credential: str | None = None


class HeartbeatRequest(_Model):
    lease_s: float = Field(default=30.0, gt=0, le=3600)


class CompleteRequest(_Model):
    status: Literal["succeeded", "failed", "timeout"]
    reward: Number | None = None  # a float the agent returned: stored as a reward of source "returned"
    error: str | None = Field(default=None, max_length=20_000)
    after_llm_seq: Seq | None = None
    # how many agent scopes the attempt opened (runners of agl-core ≥ 0.1 send it); with any, its calls that
    # bypassed agl's HTTP hook are marked `missed`
    agent_scopes: int | None = Field(default=None, ge=0)
    # LLM calls the agent sent elsewhere than agl during the attempt (runners of agl-core ≥ 0.1 send them)
    bypassed_llm_calls: int | None = Field(default=None, ge=0, le=INT64_MAX)
    bypassed_llm_url: str | None = Field(default=None, max_length=2000)
    external_llm_calls: int | None = Field(default=None, ge=0, le=INT64_MAX)
    bypassed_llm_answered: int | None = Field(default=None, ge=0, le=INT64_MAX)
    bypassed_llm_refused: int | None = Field(default=None, ge=0, le=INT64_MAX)


# --------------------------------------------------------------------------------------------- rewards


class RewardIn(_Model):
    rollout_id: str
    attempt_id: str
    value: Number
    name: str = Field(default="reward", min_length=1, max_length=200)
    source: RewardSource = RewardSource.explicit
    after_llm_seq: Seq | None = None
    span_id: str | None = None
    agent_name: str | None = None
    timestamp: Timestamp | None = None
    metadata: dict[str, Json] = Field(default_factory=dict)
    uid: str | None = Field(default=None, max_length=100)  # client-made key: a re-sent reward is stored once


class Reward(RewardIn):
    id: int
    timestamp: float


# ----------------------------------------------------------------------------------------------- spans


class SpanIn(_Model):
    """One finished span, OpenTelemetry-compatible (hex trace/span ids, unix-second times)."""

    trace_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    span_id: str = Field(pattern=r"^[0-9a-f]{16}$")
    parent_id: str | None = Field(default=None, pattern=r"^[0-9a-f]{16}$")
    name: str = Field(min_length=1, max_length=1000)
    kind: str = "internal"
    start_time: Timestamp
    end_time: Timestamp
    attributes: dict[str, Json] = Field(default_factory=dict)
    status: SpanStatus = SpanStatus.unset
    status_message: str | None = None
    events: list[dict[str, Json]] = Field(default_factory=list)
    rollout_id: str | None = None
    attempt_id: str | None = None
    agent_name: str | None = None
    source: Literal["agl", "otlp"] = "agl"

    @field_validator("end_time")
    @classmethod
    def _ends_after_start(cls, v: float, info: Any) -> float:
        start = info.data.get("start_time")
        if start is not None and v < start:
            raise ValueError(f"end_time {v} is before start_time {start}")
        return v


class Span(SpanIn):
    pass


class SpanBatch(_Model):
    spans: list[SpanIn] = Field(max_length=100_000)


# ------------------------------------------------------------------------------------------- LLM calls


# How every reason a call was stored not trainable for the way it was sampled begins (greedy, top-p, penalties): the
# proxy writes them (agl.server.call_record.untrainable_sampling), the attempt's report counts them
SAMPLING_REASON_PREFIX = "sampled "


class LLMCall(_Model):
    """One chat completion that went through the proxy, with the exact ids the backend consumed and produced."""

    id: str
    rollout_id: str
    attempt_id: str
    seq: int
    agent_name: str | None
    attribution: Attribution
    trace_id: str | None
    parent_span_id: str | None
    model_requested: str | None
    model: str | None
    model_version: int | None
    request: dict[str, JsonValue]  # messages, tools and sampling parameters as the agent sent them
    response_message: dict[str, JsonValue] | None
    prompt_ids: list[int] | None
    response_ids: list[int] | None
    logprobs: list[float] | None
    finish_reason: str | None
    stream: bool
    status: Literal["ok", "error"]
    http_status: int
    error: str | None
    started_at: float
    latency_s: float
    usage: dict[str, JsonValue]
    trainable: bool
    not_trainable_reason: str | None
    # The sampling temperature the backend was asked to use (the proxy always sends one): the distribution the
    # response was drawn from, softmax(logits / temperature), which the trainer's log-probs must match. None:
    # not known (a store written before agl recorded it: temperature 1 is assumed).
    temperature: float | None = None
    # The acting agent's stable second name, where its scope gave one (a CrewAI role before `{topic}` is filled
    # in): training selection matches it as well as `agent_name`.
    agent_key: str | None = None
    # The API the agent called: `chat` (chat completions), `responses` (OpenAI's Responses API) or `messages`
    # (Anthropic's Messages API), the last two answered by the proxy through a chat completion. Last, as its store
    # column is.
    route: Literal["chat", "responses", "messages"] = "chat"
    # The engine that answered, where `agl serve` routes over several (`--upstream` given more than once): its
    # base URL. None: the one upstream, or a store written before agl recorded it. Last, as its store column is.
    engine: str | None = None


# -------------------------------------------------------------------------------------- model versions


class EngineIn(_Model):
    """An engine for the proxy to route calls over: an OpenAI-compatible base URL ending in /v1."""

    url: str = Field(min_length=8, max_length=2000, pattern=r"^https?://[^\s]+$")


class ModelVersionIn(_Model):
    name: str = Field(min_length=1, max_length=200)
    upstream_model: str | None = None  # the model name the backend serves this version under
    # per-agent policies: the backend model (e.g. LoRA adapter) each named agent's calls go to; other agents'
    # calls go to `upstream_model`
    agent_models: dict[str, str] = Field(default_factory=dict)
    metadata: dict[str, Json] = Field(default_factory=dict)


class ModelVersion(ModelVersionIn):
    version: int
    created_at: float


# ------------------------------------------------------------------------------------------------- views


class RolloutDetail(_Model):
    """Everything stored about one rollout, for `agl show` and the trainer."""

    rollout: Rollout
    task: Task
    attempts: list[Attempt]
    spans: list[Span]
    llm_calls: list[LLMCall]
    rewards: list[Reward]

    def with_rewards(self, rewards: list[Reward]) -> RolloutDetail:
        """A copy holding these rewards instead (AIR's, added to the stored ones)."""
        return self.model_copy(update={"rewards": rewards})


class DetailsRequest(_Model):
    ids: list[str] = Field(max_length=10_000)


class Page(_Model):
    items: list[Any]
    total: int
