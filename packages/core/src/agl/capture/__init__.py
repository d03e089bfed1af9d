"""Capture: the agent's side. What runs in a worker beside the user's agent and records what it does.

- `decorator` (`agl.rollout`) and `llm` (`agl.LLM`, the handle an agent reaches its model through);
- `runner`: claims rollouts, runs the agent, reports the outcome and its failure (`agl worker`);
- `agent_loader`: finds the user's agent in a file or module;
- `instrumentation`: the base class every framework adapter and the HTTP hook share (`instrument()` /
  `uninstrument()`); it lives here because `tracing.http_inject` is one of its subclasses;
- `tracing/`: agent scopes, spans, rewards and the headers that carry them, OpenTelemetry set-up.

Capture imports only `agl.common` and the public records and client (`agl.schema`, `agl.protocol`, `agl.client`):
it never imports the server, the store or the learning side.
"""
