"""What `agl serve` is started with (`ServerSettings`): where its store is, where it listens, its token, its upstream,
and the caps on what a request may cost. Below the app and its routes, which both read it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from agl.server.connections import ConnectionLimits
from agl.server.otlp import DEFAULT_MAX_SPANS
from agl.server.proxy import UpstreamConfig
from agl.server.reward_range import DEFAULT_MAX_ABS_REWARD


@dataclass
class ServerSettings:
    run_dir: Path
    host: str = "127.0.0.1"
    port: int = 8765
    token: str | None = None
    upstream: UpstreamConfig = field(default_factory=lambda: UpstreamConfig(base_url=None))
    served_model: str = "agl-policy"
    max_body_bytes: int = 32 * 1024 * 1024
    sweep_interval_s: float = 1.0
    # Host names the server answers to besides localhost, loopback addresses and the bound address
    allowed_hosts: tuple[str, ...] = ()
    # how long /healthz waits for a write to go through before it answers 503
    health_timeout_s: float = 5.0
    # the longest a hold on new LLM calls keeps them waiting while the calls in flight drain (agl.server.call_gate)
    hold_drain_max_s: float = 30.0
    # spans one OTLP export request may hold (413 past it)
    max_spans_per_request: int = DEFAULT_MAX_SPANS
    # what a connection may cost before its request reaches the app (agl.server.connections)
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)
    # rewards are accepted in [-max_abs_reward, max_abs_reward] (agl.server.reward_range)
    max_abs_reward: float = DEFAULT_MAX_ABS_REWARD
    # a token that opens the engine routes of a server without `token` (a trainer gives it to the server it starts;
    # agl.server.engine_admission)
    admin_token: str | None = None
    # the hosts engines may be added on at run time (empty: any but link-local addresses)
    engine_hosts: tuple[str, ...] = ()
    # whether engines added at run time get the upstream's API key (those on the command line always do)
    api_key_to_added_engines: bool = False
