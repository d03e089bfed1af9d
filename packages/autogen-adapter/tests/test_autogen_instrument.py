"""The entry point: importing patches nothing, `instrument()` is idempotent, `uninstrument()` removes every hook
(and attribution with it), and an instrumented app runs unchanged outside a rollout."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from types import ModuleType
from typing import Any

import pytest
from autogen_agentchat.agents import AssistantAgent, BaseChatAgent
from autogen_agentchat.teams._group_chat._base_group_chat_manager import BaseGroupChatManager

import agl
import agl_autogen
from agl_autogen.turns import ORIGINAL

CHECK_NO_PATCH = """
import agl_autogen
from autogen_agentchat.agents import AssistantAgent, BaseChatAgent
from autogen_agentchat.teams._group_chat._base_group_chat_manager import BaseGroupChatManager
assert not hasattr(AssistantAgent.on_messages_stream, "__agl_autogen_original__")
assert "on_message_impl" not in BaseGroupChatManager.__dict__
assert "__init_subclass__" not in BaseChatAgent.__dict__
assert not agl_autogen.is_instrumented()
"""


def test_import_patches_nothing() -> None:
    subprocess.run([sys.executable, "-c", CHECK_NO_PATCH], check=True, timeout=60)


def test_instrument_is_idempotent() -> None:
    agl_autogen.instrument()
    wrapped = AssistantAgent.on_messages_stream
    agl_autogen.instrument()
    assert AssistantAgent.on_messages_stream is wrapped
    assert not hasattr(getattr(wrapped, ORIGINAL), ORIGINAL)  # wrapped once, not twice
    assert agl_autogen.is_instrumented()


def test_uninstrument_restores_the_classes() -> None:
    agl_autogen.instrument()
    original_stream = getattr(AssistantAgent.on_messages_stream, ORIGINAL)
    original_messages = getattr(AssistantAgent.on_messages, ORIGINAL)
    agl_autogen.uninstrument()
    agl_autogen.uninstrument()  # idempotent too
    assert AssistantAgent.on_messages_stream is original_stream
    assert AssistantAgent.on_messages is original_messages
    assert "on_message_impl" not in BaseGroupChatManager.__dict__
    assert "__init_subclass__" not in BaseChatAgent.__dict__
    assert not agl_autogen.is_instrumented()

    class LaterAgent(AssistantAgent):  # defined while uninstrumented: left alone
        async def on_messages_stream(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            async for item in super().on_messages_stream(*args, **kwargs):
                yield item

    assert not hasattr(LaterAgent.on_messages_stream, ORIGINAL)
    agl_autogen.instrument()
    assert hasattr(LaterAgent.on_messages_stream, ORIGINAL)  # existing subclasses are found on instrument


def test_classes_created_while_instrumented_are_restored_too() -> None:
    agl_autogen.instrument()

    class Sub(AssistantAgent):
        async def on_messages_stream(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            async for item in super().on_messages_stream(*args, **kwargs):
                yield item

    assert hasattr(Sub.on_messages_stream, ORIGINAL)
    agl_autogen.uninstrument()
    assert not hasattr(Sub.on_messages_stream, ORIGINAL)


def test_uninstrumented_team_calls_are_not_attributed(example: ModuleType, run_rollout: Any) -> None:
    # The same run as the attributed one in test_autogen_teams, with the hooks removed: the proxy gets no names
    # and no tool span is recorded, which is what the adapter adds.
    agl_autogen.uninstrument()
    task = {
        "question": "What is 12+30?",
        "answer": 42,
        "solver_prompt": "agl-tools: calculator\nagl-say: The answer is {tool}.",
        "verifier_prompt": "agl-say: APPROVE",
    }
    detail = run_rollout(example.solve_async, task)
    assert len(detail.llm_calls) == 3
    assert {(c.agent_name, c.attribution.value) for c in detail.llm_calls} == {(None, "unattributed")}
    assert detail.spans == []


def test_instrumented_app_runs_unchanged_outside_a_rollout(example: ModuleType, agl_upstream: str) -> None:
    assert agl.current_rollout() is None
    llm = agl.LLM(base_url=agl_upstream, model="scripted")
    task = {
        "question": "What is 12+30?",
        "answer": 42,
        "solver_prompt": "agl-tools: calculator\nagl-say: The answer is {tool}.",
        "verifier_prompt": "agl-say: APPROVE",
    }
    assert example.solve(task, llm) == 1.0
    assert asyncio.run(example.solve_streaming(task, llm)) == 1.0
    assert asyncio.run(example.solve_streaming({**task, "question": "What is 7/0?"}, llm)) == 0.0


def test_example_calculator_is_safe(example: ModuleType) -> None:
    assert example.calculator("12 * (3 + 4)") == "84"
    assert example.calculator("7/2") == "3.5"
    assert example.calculator("-2**10") == "-1024"
    for bad in ("__import__('os').system('true')", "2**1000", "x + 1", "12 +", "True + 1"):
        with pytest.raises(ValueError):
            example.calculator(bad)
    with pytest.raises(ZeroDivisionError):
        example.calculator("7/0")


def test_a_known_model_name_gives_no_model_mismatch_warning_under_agl(run_rollout: Any) -> None:
    """`gpt-4o` resolves to a dated model in AutoGen, which warns on every answer that names another; under agl
    the answer comes from the policy, so agl silences that warning (and names the serving model with each call)."""
    import warnings

    from autogen_agentchat.agents import AssistantAgent
    from autogen_ext.models.openai import OpenAIChatCompletionClient

    import agl

    @agl.rollout
    async def ask(task: Any, llm: agl.LLM) -> float:
        client = OpenAIChatCompletionClient(model="gpt-4o", base_url=llm.base_url, api_key=llm.api_key)
        await AssistantAgent("helper", model_client=client).run(task="hello")
        return 1.0

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")  # what a user's process shows
        import agl_autogen

        agl_autogen.uninstrument()
        agl_autogen.instrument()  # after the default: its filter comes first, as in a real process
        detail = run_rollout(ask, "hello")
    assert detail.llm_calls and not [w for w in seen if "Resolved model mismatch" in str(w.message)]
    agl_autogen.uninstrument()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        run_rollout(ask, "again")
    assert [w for w in seen if "Resolved model mismatch" in str(w.message)]  # what it silenced
