"""Span attribute and HTTP header names agl reads and writes, in one place.

Tool spans also carry the OpenTelemetry GenAI semantic-convention keys (`gen_ai.*`) so that traces from
other instrumentations read the same way.
"""

# span attributes
ROLLOUT_ID = "agl.rollout_id"
ATTEMPT_ID = "agl.attempt_id"
AGENT_NAME = "agl.agent.name"
SPAN_KIND = "agl.span.kind"  # "agent" | "tool" | "llm" | "reward" | "custom"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_ARGUMENTS = "agl.tool.arguments"
TOOL_RESULT = "agl.tool.result"
# the sequence number of the last LLM call answered when the span ended: places tool outcomes in the run
AFTER_LLM_SEQ = "agl.after_llm_seq"

# HTTP headers the client adds to LLM requests sent to the proxy
HEADER_AGENT = "x-agl-agent"
HEADER_PARENT_SPAN = "x-agl-parent-span"
HEADER_TRACEPARENT = "traceparent"
# on every request that passed through agl's HTTP hook (see agl.tracing.http_inject): its absence tells the proxy
# that the agent used an HTTP client agl does not patch
HEADER_HOOK = "x-agl-hook"
# HTTP header the proxy adds to its responses: the sequence number it gave the call
HEADER_LLM_SEQ = "x-agl-llm-seq"
# HTTP header on the answer to an attempt's completion: how many of its LLM calls lost their agent name
HEADER_MISSED_ATTRIBUTION = "x-agl-missed-attribution"
