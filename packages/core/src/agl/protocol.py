"""What agl's processes say to each other over HTTP besides the payloads: header names and the error envelope.

In one place so that the proxy, the server, the runner's HTTP hook, the embedded engine and the scripted test
backend cannot drift apart.
"""

from __future__ import annotations

from typing import Any

import orjson

# Headers the client adds to LLM requests sent to the proxy (see agl.capture.tracing.http_inject)
HEADER_AGENT = "x-agl-agent"  # the acting agent's name, percent-encoded UTF-8
HEADER_AGENT_KEY = "x-agl-agent-key"  # its stable second name (agl.agent(name, key=...)), percent-encoded UTF-8
HEADER_PARENT_SPAN = "x-agl-parent-span"
HEADER_TRACEPARENT = "traceparent"
# On every request that passed through agl's HTTP hook: its absence tells the proxy that the agent used an HTTP
# client agl does not patch
HEADER_HOOK = "x-agl-hook"
# On requests for the fixed LLM URL (`http://HOST:PORT/v1/...`, one for the whole run): the rollout and attempt
# that a per-rollout proxy URL would carry in its path, added at send time from the running rollout's context
HEADER_ROLLOUT_ID = "x-agl-rollout-id"
HEADER_ATTEMPT_ID = "x-agl-attempt-id"
# Set by `agl worker` before it imports the agent: the run's fixed LLM URL, for clients built at import time
ENV_LLM_BASE_URL = "AGL_LLM_BASE_URL"
# Headers the proxy adds to its answers: the sequence number it gave the call
HEADER_LLM_SEQ = "x-agl-llm-seq"
# Header the proxy adds to what it sends the backend: "train" or "eval" (agl's engine decodes evaluations alike)
HEADER_ROLLOUT_MODE = "x-agl-rollout-mode"
# Header on the answer to an attempt's completion: how many of its LLM calls lost their agent name
HEADER_MISSED_ATTRIBUTION = "x-agl-missed-attribution"
# ... and which of its calls were stored not trainable for how their agent sampled them (greedy, top-p): JSON, ASCII,
# `[[agent or null, count, one reason], ...]`
HEADER_UNTRAINABLE_SAMPLING = "x-agl-untrainable-sampling"
# The agent name a harness's sub-agent gets under a command-line agent's name (agl.server.fixed_url): `NAME/subagent`
# for Claude Code's, `NAME/<kind>` for those that say their kind (Codex)
SUB_AGENT_LABEL = "subagent"


def error_body(message: str, type_: str, code: str | None = None) -> dict[str, Any]:
    """The OpenAI-style error envelope every agl HTTP error uses (the OpenAI SDK shows its message)."""
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


def error_bytes(message: str, type_: str, code: str | None = None) -> bytes:
    return orjson.dumps(error_body(message, type_, code))
