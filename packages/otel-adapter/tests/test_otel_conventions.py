"""The conventions table, span by span: which spans are agents and tools, and what each names."""

from __future__ import annotations

from typing import Any

import pytest

from agl_otel.conventions import CONVENTIONS, GENAI, GENAI_BY_NAME, OPENINFERENCE, PYDANTIC_AI_V2, error_type, match

GENAI_AGENT = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "planner", "gen_ai.agent.id": "a-7"}
GENAI_TOOL = {
    "gen_ai.operation.name": "execute_tool",
    "gen_ai.tool.name": "calculator",
    "gen_ai.tool.call.id": "call_1",
    "gen_ai.tool.call.arguments": '{"expression": "1+2"}',
    "gen_ai.tool.call.result": "3",
}


@pytest.mark.parametrize(
    ("span_name", "attributes", "expected"),
    [
        # GenAI semantic conventions
        ("invoke_agent planner", GENAI_AGENT, (GENAI, "agent", "planner", "a-7", None)),
        (
            "invoke_agent",
            {"gen_ai.operation.name": "create_agent", "gen_ai.agent.name": "x"},
            (GENAI, "agent", "x", None, None),
        ),
        ("invoke_agent helper", {"gen_ai.operation.name": "invoke_agent"}, (GENAI, "agent", "helper", None, None)),
        ("execute_tool calculator", GENAI_TOOL, (GENAI, "tool", "calculator", None, "call_1")),
        ("execute_tool search", {"gen_ai.operation.name": "execute_tool"}, (GENAI, "tool", "search", None, None)),
        # an agent span whose attributes come after its start (Microsoft Agent Framework): its name alone
        ("invoke_agent writer", {}, (GENAI_BY_NAME, "agent", "writer", None, None)),
        # OpenInference (smolagents names its agent span `<name>.run` and sets no agent.name)
        (
            "x",
            {"openinference.span.kind": "AGENT", "agent.name": "researcher"},
            (OPENINFERENCE, "agent", "researcher", None, None),
        ),
        ("manager.run", {"openinference.span.kind": "AGENT"}, (OPENINFERENCE, "agent", "manager", None, None)),
        (
            "WebSearchTool",
            {"openinference.span.kind": "TOOL", "tool.name": "web_search"},
            (OPENINFERENCE, "tool", "web_search", None, None),
        ),
        # Pydantic AI's instrumentation version 2
        ("agent run", {"agent_name": "support"}, (PYDANTIC_AI_V2, "agent", "support", None, None)),
        (
            "running tool",
            {"gen_ai.tool.name": "lookup", "gen_ai.tool.call.id": "c9"},
            (PYDANTIC_AI_V2, "tool", "lookup", None, "c9"),
        ),
    ],
)
def test_a_marked_span_names_its_agent_or_tool(
    span_name: str, attributes: dict[str, Any], expected: tuple[Any, ...]
) -> None:
    found = match(span_name, attributes)
    assert found is not None
    assert (found.convention.source, found.kind, found.name, found.key, found.call_id) == expected


@pytest.mark.parametrize(
    ("span_name", "attributes"),
    [
        ("chat gpt-4o", {"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o"}),  # an LLM call
        ("invoke_agent", {"gen_ai.operation.name": "invoke_agent"}),  # names no agent at all
        ("execute_tool", {"gen_ai.operation.name": "execute_tool"}),
        ("x", {"openinference.span.kind": "LLM"}),
        ("x", {"openinference.span.kind": "CHAIN", "agent.name": "not an agent span"}),
        ("model request", {"agent_name": "support"}),  # v2's attribute on a span that is not its agent run
        ("HTTP POST", {"http.method": "POST"}),
        ("invoke_agent", {}),  # the prefix with no name after it
        ("run", {"gen_ai.agent.name": "x"}),  # a name attribute on a span neither named nor marked as an agent's
        ("anything", None),
    ],
)
def test_other_spans_are_neither(span_name: str, attributes: dict[str, Any] | None) -> None:
    assert match(span_name, attributes) is None


def test_arguments_and_result_are_read_where_each_convention_keeps_them() -> None:
    genai = match("execute_tool calculator", GENAI_TOOL)
    assert genai is not None and (genai.arguments, genai.result) == ('{"expression": "1+2"}', "3")
    oi = match("t", {"openinference.span.kind": "TOOL", "tool.name": "t", "input.value": "in", "output.value": "out"})
    assert oi is not None and (oi.arguments, oi.result) == ("in", "out")
    v2 = match("running tool", {"gen_ai.tool.name": "t", "tool_arguments": "{}", "tool_response": "ok"})
    assert v2 is not None and (v2.arguments, v2.result) == ("{}", "ok")


def test_asking_for_one_kind_skips_the_other() -> None:
    assert match("invoke_agent planner", GENAI_AGENT, "tool") is None
    assert match("execute_tool calculator", GENAI_TOOL, "agent") is None


def test_error_type_is_read_per_convention() -> None:
    (genai_tool,) = [c for c in CONVENTIONS if c.source == GENAI and c.kind == "tool"]
    (oi_tool,) = [c for c in CONVENTIONS if c.source == OPENINFERENCE and c.kind == "tool"]
    assert error_type({"error.type": "ZeroDivisionError"}, genai_tool) == "ZeroDivisionError"
    assert error_type({"exception.type": "ValueError"}, oi_tool) == "ValueError"
    assert error_type({"exception.type": "ValueError"}, genai_tool) is None
    assert error_type({}, genai_tool) is None


def test_an_agent_span_named_after_its_agent_and_the_workflow_root() -> None:
    """openinference-instrumentation-openai-agents 2.6.0: `planner` (AGENT) names the planner before its attributes
    come; the trace's root, `Agent workflow` (AGENT too), is no agent."""
    found = match("planner", {"openinference.span.kind": "AGENT"}, "agent")
    assert found is not None and found.name == "planner"
    assert match("Agent workflow", {"openinference.span.kind": "AGENT"}, "agent") is None
    smolagents = match("manager.run", {"openinference.span.kind": "AGENT"}, "agent")
    assert smolagents is not None and smolagents.name == "manager"  # the `.run` row still comes first


def test_names_and_errors_from_json_attributes() -> None:
    """A name under a key of OpenInference's `metadata` (DSPy, Haystack with `using_metadata`); a LangChain tool
    whose error the agent handled: its ToolMessage of status "error" in `output.value`."""
    metadata = {"openinference.span.kind": "CHAIN", "metadata": '{"agent_name": "solver"}'}
    found = match("ReActV2.forward", metadata, "agent")
    assert found is not None and found.name == "solver"
    assert match("ReActV2.forward", {**metadata, "metadata": "not json"}, "agent") is None
    tool = {"openinference.span.kind": "TOOL", "tool.name": "calculator", "input.value": "9/0"}
    handled = '{"type": "tool", "data": {"content": "division by zero", "status": "error"}}'
    failed = match("calculator", {**tool, "output.value": handled}, "tool")
    assert failed is not None and failed.arguments == "9/0"
    assert error_type({**tool, "output.value": handled}, failed.convention) == "division by zero"
    assert error_type({**tool, "output.value": '{"data": {"status": "success"}}'}, failed.convention) is None


def test_every_row_can_match_something() -> None:
    """A row whose conditions no span could meet (a typo in an attribute) would silently never match."""
    for convention in CONVENTIONS:
        attributes: dict[str, Any] = {k: (sorted(v)[0] if v else "x") for k, v in convention.when.items()}
        attributes[convention.name_attributes[0]] = "named"
        span_name = sorted(convention.span_names)[0] if convention.span_names else "span"
        if convention.by_span_name:
            span_name = f"{convention.name_prefix}named{convention.name_suffix}"
        if convention.name_is_span_name:  # a span named after its agent, before its name attribute is set
            del attributes[convention.name_attributes[0]]
            span_name = "named"
        found = match(span_name, attributes, convention.kind)
        assert found is not None and found.convention == convention and found.name == "named", convention
