"""One client of each OpenAI-compatible library, built at import time with neither a base URL nor a key, as their
READMEs show: each reads its base URL from the environment (`agl worker` sets every variable they read). A rollout
`{"client": NAME}` makes one call with that client. Libraries not installed are left out of CLIENTS."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import agl

ASK = "What is 2 + 2?"
CLIENTS: dict[str, Callable[[], str]] = {}

try:
    import openai

    _openai = openai.OpenAI(max_retries=0)
    CLIENTS["openai"] = lambda: str(
        _openai.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": ASK}])
        .choices[0]
        .message.content
    )
except ImportError:
    pass

try:
    from langchain_openai import ChatOpenAI

    _langchain = ChatOpenAI(model="gpt-4o", max_retries=0)
    CLIENTS["langchain-openai"] = lambda: str(_langchain.invoke(ASK).content)
except ImportError:
    pass

try:
    from llama_index.core.llms import ChatMessage
    from llama_index.llms.openai_like import OpenAILike

    _llama_index = OpenAILike(model="gpt-4o", is_chat_model=True, max_retries=0)  # reads OPENAI_API_BASE
    CLIENTS["llama-index"] = lambda: str(_llama_index.chat([ChatMessage(role="user", content=ASK)]).message.content)
except ImportError:
    pass

try:
    import litellm

    CLIENTS["litellm"] = lambda: str(
        litellm.completion(model="openai/gpt-4o", messages=[{"role": "user", "content": ASK}])
        .choices[0]
        .message.content
    )
except ImportError:
    pass

try:
    import dspy

    _dspy = dspy.LM("openai/gpt-4o-mini", cache=False, num_retries=0)  # through LiteLLM
    CLIENTS["dspy"] = lambda: str(_dspy(ASK)[0])
except ImportError:
    pass

try:
    from agno.agent import Agent as AgnoAgent
    from agno.models.openai import OpenAIChat

    _agno = AgnoAgent(model=OpenAIChat(id="gpt-4o"))
    CLIENTS["agno"] = lambda: str(_agno.run(ASK).content)
except ImportError:
    pass

try:
    from haystack.components.generators.chat import OpenAIChatGenerator
    from haystack.dataclasses import ChatMessage as HaystackMessage

    _haystack = OpenAIChatGenerator(model="gpt-4o")
    CLIENTS["haystack"] = lambda: str(_haystack.run([HaystackMessage.from_user(ASK)])["replies"][0].text)
except ImportError:
    pass

try:
    from smolagents import OpenAIModel

    _smolagents = OpenAIModel("gpt-4o")
    CLIENTS["smolagents"] = lambda: str(_smolagents([{"role": "user", "content": ASK}]).content)
except ImportError:
    pass

try:
    from agents import Agent as SdkAgent
    from agents import Runner

    _sdk = SdkAgent(name="asker", instructions="Answer.", model="gpt-4o")
    CLIENTS["openai-agents"] = lambda: str(asyncio.run(Runner.run(_sdk, ASK)).final_output)
except ImportError:
    pass


@agl.rollout
def ask(task: dict[str, Any], llm: agl.LLM) -> float:
    return 1.0 if CLIENTS[task["client"]]() else 0.0
