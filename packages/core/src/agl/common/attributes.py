"""Span attribute and HTTP header names agl reads and writes, in one place.

Tool spans also carry the OpenTelemetry GenAI semantic-convention keys (`gen_ai.*`) so that traces from
other instrumentations read the same way.
"""

# The HTTP header names are agl's protocol (agl.protocol); they are re-exported here because the tracing code
# reads them beside the span attribute names.
from agl.protocol import (
    HEADER_AGENT,
    HEADER_AGENT_KEY,
    HEADER_ATTEMPT_ID,
    HEADER_HOOK,
    HEADER_LLM_SEQ,
    HEADER_MISSED_ATTRIBUTION,
    HEADER_PARENT_SPAN,
    HEADER_ROLLOUT_ID,
    HEADER_TRACEPARENT,
    HEADER_UNTRAINABLE_SAMPLING,
)

__all__ = [
    "AFTER_LLM_SEQ",
    "AGENT_KEY",
    "AGENT_NAME",
    "ATTEMPT_ID",
    "HEADER_AGENT",
    "HEADER_AGENT_KEY",
    "HEADER_ATTEMPT_ID",
    "HEADER_HOOK",
    "HEADER_LLM_SEQ",
    "HEADER_MISSED_ATTRIBUTION",
    "HEADER_PARENT_SPAN",
    "HEADER_ROLLOUT_ID",
    "HEADER_TRACEPARENT",
    "HEADER_UNTRAINABLE_SAMPLING",
    "ROLLOUT_ID",
    "SPAN_KIND",
    "TOOL_ARGUMENTS",
    "TOOL_CALL_ID",
    "TOOL_CALL_ORDINAL",
    "TOOL_CALL_ORDINAL_OF",
    "TOOL_COMMAND",
    "TOOL_EXIT_CODE",
    "TOOL_NAME",
    "TOOL_OUTPUT_TAIL",
    "TOOL_RESULT",
]

# span attributes
ROLLOUT_ID = "agl.rollout_id"
ATTEMPT_ID = "agl.attempt_id"
AGENT_NAME = "agl.agent.name"
AGENT_KEY = "agl.agent.key"  # an agent scope's stable second name (agl.agent(name, key=...))
SPAN_KIND = "agl.span.kind"  # "agent" | "tool" | "llm" | "reward" | "custom"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_ARGUMENTS = "agl.tool.arguments"
TOOL_RESULT = "agl.tool.result"
# a tool run a harness reported (agl.capture.tool_runs): what it ran, how it exited, its output's end, and, where the
# harness gives no call id, its order among its agent's calls of the tools listed (which call asked for it)
TOOL_COMMAND = "tool.command"
TOOL_EXIT_CODE = "tool.exit_code"
TOOL_OUTPUT_TAIL = "tool.output_tail"
TOOL_CALL_ORDINAL = "agl.tool.call_ordinal"
TOOL_CALL_ORDINAL_OF = "agl.tool.call_ordinal_of"
# the sequence number of the last LLM call answered when the span ended: places tool outcomes in the run
AFTER_LLM_SEQ = "agl.after_llm_seq"
