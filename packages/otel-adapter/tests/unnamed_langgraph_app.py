"""LangChain's `create_agent` without `name=`, traced by OpenInference and read by agl_otel: LangGraph gives its nodes
no agent name, so no call is attributed; the worker's warning points at the fix."""

from __future__ import annotations

from typing import Any

from langchain.agents import create_agent
from langchain_openai import ChatOpenAI
from openinference.instrumentation.langchain import LangChainInstrumentor

import agl
import agl_otel

LangChainInstrumentor().instrument()
agent = create_agent(ChatOpenAI(model="gpt-4o-mini"), tools=[], system_prompt="You are helpful.")  # no name=


@agl.rollout
def solve(task: Any, llm: agl.LLM) -> float:
    agl_otel.instrument()
    agent.invoke({"messages": [{"role": "user", "content": str(task)}]})
    return 1.0
