"""An app traced by a framework whose spans no convention knows: agl_otel is on, yet no call gets an agent name."""

from __future__ import annotations

from typing import Any

from opentelemetry import trace

import agl
import agl_otel


@agl.rollout
def solve(task: Any, llm: agl.LLM) -> float:
    agl_otel.instrument()
    tracer = trace.get_tracer("some.framework")
    client = llm.openai_client(max_retries=0)
    with tracer.start_as_current_span("workflow.run"):
        for _ in range(2):
            with tracer.start_as_current_span("plan.step"):
                client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": str(task)}])
    return 1.0
