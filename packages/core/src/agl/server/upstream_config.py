"""What `agl serve` forwards to and what an upstream's answer may cost (`UpstreamConfig`, read by the proxy)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from agl.server.request_cost import MAX_REQUEST_STRUCTURES

MiB = 1024 * 1024


class AgentSet(Protocol):
    """Which agents a setting covers (agl.learn.selection.AgentSelection, which the command line builds)."""

    def selects(self, agent_name: str | None, agent_key: str | None = None) -> bool: ...


@dataclass
class UpstreamConfig:
    base_url: str | None  # an OpenAI-compatible base URL ending in /v1; None: no backend configured
    # more engines serving the same model (vLLM on other nodes): calls are routed over all (agl.server.engines)
    more_urls: tuple[str, ...] = ()
    api_key: str | None = None
    model: str | None = None  # replaces the model the agent asked for, when set
    token_ids: str = "auto"  # "auto": ask, and stop asking if the backend rejects it; "always"; "never"
    timeout_s: float = 600.0
    # connections to the upstream held at once; calls past it queue for one (up to timeout_s), never fail
    max_connections: int = 1024
    # the sampling temperature of a call whose agent sets none; always sent, so the store knows the distribution
    # every response was drawn from (a backend's own default may be anything: vLLM uses the model's config)
    temperature: float | None = 1.0
    # every call of an evaluation rollout is sent with this temperature, whatever the agent asked for, so that
    # evaluations against any backend decode alike (agl's own engine does the same from the mode header)
    eval_temperature: float | None = None
    # the agents whose training calls are sampled as the run says (`temperature`, and no top-p, top-k, penalties or
    # logit bias), whatever they asked: in RL the trainer owns the sampling, and a greedy or truncated call is no
    # sample of the policy it trains. None: each call is sent with its own sampling (`agl serve --own-sampling-for`)
    own_sampling: AgentSet | None = None
    # the most bytes of one non-streamed answer read: a vLLM answer of 32k tokens with 20 top log-probs each is
    # about 45 MB of JSON, and past the cap one runaway answer (read whole, then parsed) would cost gigabytes
    max_answer_bytes: int = 64 * MiB
    # the most bytes of one SSE event of a stream not yet ended by its blank line: an event carries a few tokens,
    # the first also the prompt's ids (a million-token prompt is ~8 MB); a stream without separators would
    # otherwise be buffered whole
    max_event_bytes: int = 16 * MiB
    # a stream's total cap, past which it is cut and stored not trainable (an upstream that never stops, or one
    # sending more than it was asked for, would otherwise be relayed and stored whole): its bytes, and its tokens
    # when the request sets no max_tokens (when it does, that number and a little slack)
    max_stream_bytes: int = 64 * MiB
    max_stream_tokens: int = 131_072
    # the most JSON objects and lists one request body may open (agl.server.call_record says why)
    max_request_structures: int = MAX_REQUEST_STRUCTURES
