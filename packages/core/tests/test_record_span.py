"""Spans recorded after the fact (for framework hooks with separate start/end callbacks) look like `agl.tool`'s,
and `enter_agent` / `exit_agent` scope attribution without a `with` block."""

from __future__ import annotations

import contextvars
import threading

import agl
from agl.capture.tracing.context import RolloutContext, reset_rollout, set_rollout
from agl.common import attributes as attr
from agl.schema import SpanStatus


def _ctx() -> RolloutContext:
    return RolloutContext(rollout_id="r1", attempt_id="a1", server_url="http://x")


def test_record_tool_matches_the_with_form_and_keeps_the_error() -> None:
    ctx = _ctx()
    token = set_rollout(ctx)
    try:
        with agl.agent("solver"):
            with agl.tool("calc", call_id="c1", arguments={"x": 1}):
                pass
            ctx.saw_llm_seq(3)
            agl.record_tool("calc", start_time=10.0, end_time=9.0, error="ZeroDivisionError", call_id="c2", result=None)
    finally:
        reset_rollout(token)
    live, recorded = [s for s in ctx.recorder.spans if s.name == "tool:calc"]
    assert recorded.status is SpanStatus.error and recorded.status_message == "ZeroDivisionError"
    assert live.status is SpanStatus.ok
    assert recorded.agent_name == live.agent_name == "solver"
    assert recorded.end_time == recorded.start_time == 10.0  # an end before the start is clamped
    assert recorded.attributes[attr.AFTER_LLM_SEQ] == 3 and attr.AFTER_LLM_SEQ not in live.attributes
    assert recorded.attributes[attr.SPAN_KIND] == "tool" and recorded.attributes[attr.TOOL_CALL_ID] == "c2"
    assert recorded.parent_id == next(s.span_id for s in ctx.recorder.spans if s.name == "agent:solver")


def test_record_span_from_a_framework_thread_with_the_rollout_it_was_given() -> None:
    ctx = _ctx()
    out: list[str | None] = []
    # a plain thread sees no rollout: without ctx nothing is recorded; with it, the span lands in that rollout
    thread = threading.Thread(
        target=lambda: out.extend(
            [
                agl.record_span("x", kind="agent", start_time=1.0),
                agl.record_span("y", kind="agent", start_time=1.0, agent_name="writer", ctx=ctx),
            ]
        )
    )
    thread.start()
    thread.join()
    assert out[0] is None and out[1] is not None
    (span,) = ctx.recorder.spans
    assert span.name == "y" and span.agent_name == "writer" and span.attributes[attr.AGENT_NAME] == "writer"


def test_enter_and_exit_agent_nest_and_tolerate_a_foreign_token() -> None:
    outer = agl.enter_agent("writer")
    inner = agl.enter_agent("checker")
    assert agl.current_agent() == "checker"
    agl.exit_agent(inner)
    assert agl.current_agent() == "writer"
    foreign = contextvars.copy_context().run(agl.enter_agent, "elsewhere")
    agl.exit_agent(foreign)  # made in another context: ignored, not an exception
    assert agl.current_agent() == "writer"
    agl.exit_agent(outer)
    assert agl.current_agent() is None
