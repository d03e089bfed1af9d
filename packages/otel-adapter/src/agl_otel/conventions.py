"""Which OpenTelemetry spans mean "an agent runs" and "a tool ran", in the conventions frameworks emit.

One row per convention and kind: a new convention version, or a framework's own variant, is one more row. A span
matches a row when every attribute in `when` has one of the listed values (an empty set: any value), and its
name is one of `span_names` where the row gives any. The first
row that matches wins; its name is read from the first of `name_attributes` the span has, else from the span's
name with `name_prefix` / `name_suffix` taken off.

Read from (2026-11):
- OpenTelemetry GenAI semantic conventions 1.37-1.38 (`gen_ai.operation.name` = `invoke_agent` / `create_agent`
  with `gen_ai.agent.name`, `gen_ai.agent.id`; `execute_tool` with `gen_ai.tool.name`, `gen_ai.tool.call.id`,
  `gen_ai.tool.call.arguments`, `gen_ai.tool.call.result`; a failure as span status ERROR and `error.type`), as
  emitted by Microsoft Agent Framework 1.x, Pydantic AI 1.x-2.x (instrumentation version ≥ 3), Google ADK and
  Strands Agents; and the span name they prescribe (`invoke_agent <name>`) alone, for a span whose attributes
  are set after it starts (Microsoft Agent Framework's agent spans);
- Pydantic AI's instrumentation version 2 (`agent run` with `agent_name`, `running tool` with
  `gen_ai.tool.name`, `tool_arguments`, `tool_response`);
- OpenInference semantic conventions 0.1.x (`openinference.span.kind` = `AGENT` with `agent.name`, `TOOL` with
  `tool.name`, `tool.parameters`, `input.value`, `output.value`), as emitted by the `openinference-instrumentation-*`
  packages (smolagents names its agent span `<name>.run` and sets no `agent.name`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["agent", "tool"]


@dataclass(frozen=True)
class Convention:
    """How one convention marks one kind of span and where it keeps what agl needs."""

    source: str  # the convention and the versions read
    kind: Kind
    when: Mapping[str, frozenset[str]]  # attribute → the values that mark the span (empty: any value)
    name_attributes: tuple[str, ...]
    name_prefix: str = ""  # taken off the span's name when no name attribute is set
    name_suffix: str = ""
    key_attributes: tuple[str, ...] = ()  # an agent's stable id (agl's agent key)
    call_id_attributes: tuple[str, ...] = ()
    arguments_attributes: tuple[str, ...] = ()
    result_attributes: tuple[str, ...] = ()
    error_attributes: tuple[str, ...] = field(default=("error.type",))
    span_names: frozenset[str] = frozenset()  # the span's own name must be one of these (empty: any name)
    by_span_name: bool = False  # the span's own name must have name_prefix / name_suffix
    # (attribute, key): the name as a key of a JSON object an attribute holds as text (OpenInference's `metadata`),
    # tried after name_attributes; a key may be a dotted path ("a.b")
    name_json: tuple[tuple[str, str], ...] = ()
    # the span's whole name is the agent's (an instrumentor that names its AGENT span after the agent and sets
    # `agent.name` only at its end), tried last; `excluded_span_names` are spans of the kind that are no agent
    name_is_span_name: bool = False
    excluded_span_names: frozenset[str] = frozenset()
    # a span with any of these attributes is not of the row's kind, whatever it is marked (BeeAI's event spans)
    not_when: tuple[str, ...] = ()
    # (attribute, status key, message key): a JSON object an attribute holds whose status key says "error" marks a
    # failure the span's status does not (a LangChain tool whose error the agent handled: a ToolMessage of status
    # "error"); the failure's message is at the message key
    error_json: tuple[tuple[str, str, str], ...] = ()


GENAI = "OpenTelemetry GenAI semantic conventions 1.37-1.38"
GENAI_BY_NAME = "OpenTelemetry GenAI semantic conventions 1.37-1.38, by span name"
OPENINFERENCE = "OpenInference semantic conventions 0.1"
OPENINFERENCE_SPAN_NAMED = "OpenInference semantic conventions 0.1, an AGENT span named after its agent"
PYDANTIC_AI_V2 = "Pydantic AI instrumentation version 2"

CONVENTIONS: tuple[Convention, ...] = (
    Convention(
        GENAI,
        "agent",
        {"gen_ai.operation.name": frozenset({"invoke_agent", "create_agent"})},
        name_attributes=("gen_ai.agent.name",),
        name_prefix="invoke_agent ",
        key_attributes=("gen_ai.agent.id",),
    ),
    Convention(
        GENAI,
        "tool",
        {"gen_ai.operation.name": frozenset({"execute_tool"})},
        name_attributes=("gen_ai.tool.name",),
        name_prefix="execute_tool ",
        call_id_attributes=("gen_ai.tool.call.id",),
        arguments_attributes=("gen_ai.tool.call.arguments",),
        result_attributes=("gen_ai.tool.call.result",),
    ),
    # The span name the GenAI conventions prescribe, for spans whose attributes come after their start (Microsoft
    # Agent Framework starts `invoke_agent <name>` bare and sets its attributes next): an agent scope must be
    # known when its span starts
    Convention(
        GENAI_BY_NAME,
        "agent",
        {},
        name_attributes=("gen_ai.agent.name",),
        name_prefix="invoke_agent ",
        by_span_name=True,
    ),
    # --- DSPy (openinference-instrumentation-dspy 0.1.48) ---
    # DSPy has no agent names: a ReAct agent's span is a CHAIN `ReAct.forward` / `ReActV2.forward` (async:
    # `.aforward`) whose only input is the call's arguments. The app names it with OpenInference's
    # `using_metadata({"agent_name": ...})` around the call, which the tracer copies into `metadata` when the span
    # starts; only the ReAct spans count, as every span under the call carries the same metadata
    Convention(
        "OpenInference semantic conventions 0.1, DSPy ReAct with an agent_name in metadata",
        "agent",
        {"openinference.span.kind": frozenset({"CHAIN"}), "metadata": frozenset()},
        name_attributes=("agent.name",),
        name_json=(("metadata", "agent_name"),),
        span_names=frozenset({"ReAct.forward", "ReAct.aforward", "ReActV2.forward", "ReActV2.aforward"}),
    ),
    # DSPy's tool spans set no `tool.name` (the OpenInference row below passes them by): the tool is the span's
    # name (`<tool>.__call__`, async `<tool>.acall`), its arguments the call's keywords as `{"kwargs": {...}}`;
    # only spans so named claim it (by_span_name), so it may stand before the general row and read `tool.name` first
    Convention(
        "OpenInference semantic conventions 0.1, DSPy tools by span name",
        "tool",
        {"openinference.span.kind": frozenset({"TOOL"})},
        name_attributes=("tool.name",),
        by_span_name=True,
        name_suffix=".__call__",
        arguments_attributes=("input.value",),
        result_attributes=("output.value",),
        error_attributes=("exception.type", "error.type"),
    ),
    Convention(
        "OpenInference semantic conventions 0.1, DSPy tools by span name",
        "tool",
        {"openinference.span.kind": frozenset({"TOOL"})},
        name_attributes=("tool.name",),
        by_span_name=True,
        name_suffix=".acall",
        arguments_attributes=("input.value",),
        result_attributes=("output.value",),
        error_attributes=("exception.type", "error.type"),
    ),
    # --- end DSPy ---
    # --- Haystack (openinference-instrumentation-haystack 0.1.46) ---
    # Haystack's agents have no names, and the instrumentor starts a sync component span (`Agent.run`) bare, setting
    # its kind (CHAIN) and input only after it started: at start it holds only what OpenInference's context adds.
    # The app names the agent with `using_metadata({"agent_name": ...})` around its run, copied into `metadata` as
    # the span starts; only the Agent's own span counts, as every component span under it carries the same metadata
    Convention(
        "OpenInference semantic conventions 0.1, Haystack Agent with an agent_name in metadata",
        "agent",
        {"metadata": frozenset()},
        name_attributes=("agent.name",),  # never set by this instrumentor; an app or processor may add it
        name_json=(("metadata", "agent_name"),),
        span_names=frozenset({"Agent.run", "Agent.run_async"}),
    ),
    # --- end Haystack ---
    # --- CrewAI (openinference-instrumentation-crewai 1.1.21) ---
    # A crew's agent runs its task in an AGENT span the instrumentor names `<role>._execute_core` (`Task._execute_core`;
    # `<role>.<task name>._execute_core` when the task has a name, read here as the agent "<role>.<task name>"); it
    # starts the span with only its kind and sets `graph.node.id` (the role) after it started, never `agent.name`.
    # The role is read from the span's name (the general row below would take the whole name); a lone
    # `Agent.kickoff()` outside a crew is an AGENT span `<role>.kickoff` (the crew's own `<crew>.kickoff` is a CHAIN)
    Convention(
        "OpenInference semantic conventions 0.1, CrewAI task spans named <role>._execute_core",
        "agent",
        {"openinference.span.kind": frozenset({"AGENT"})},
        name_attributes=("graph.node.id",),
        name_suffix="._execute_core",
        by_span_name=True,
    ),
    Convention(
        "OpenInference semantic conventions 0.1, CrewAI Agent.kickoff spans named <role>.kickoff",
        "agent",
        {"openinference.span.kind": frozenset({"AGENT"})},
        name_attributes=("graph.node.id",),
        name_suffix=".kickoff",
        by_span_name=True,
    ),
    # --- end CrewAI ---
    Convention(
        OPENINFERENCE,
        "agent",
        {"openinference.span.kind": frozenset({"AGENT"})},
        name_attributes=("agent.name", "graph.node.name"),
        name_suffix=".run",
    ),
    # openinference-instrumentation-openai-agents 2.6.0 starts an agent's AGENT span named after the agent and sets
    # `agent.name` only when it ends; its trace's root is an AGENT span too, named after the workflow (the SDK's
    # default "Agent workflow", which is no agent). openinference-instrumentation-beeai 0.1.30 writes each event of
    # an agent's run other than its start and end (a RequirementAgent's `final_answer`) as a child span of the
    # agent's kind, named after the event and carrying the event's `metadata.path`: no agent either
    Convention(
        OPENINFERENCE_SPAN_NAMED,
        "agent",
        {"openinference.span.kind": frozenset({"AGENT"})},
        name_attributes=("agent.name",),
        name_is_span_name=True,
        excluded_span_names=frozenset({"Agent workflow"}),
        not_when=("metadata.path",),
    ),
    Convention(
        OPENINFERENCE,
        "tool",
        {"openinference.span.kind": frozenset({"TOOL"})},
        name_attributes=("tool.name",),
        # `tool.parameters` is the tool's JSON schema, not this call's arguments: those are its input
        arguments_attributes=("input.value",),
        result_attributes=("output.value",),
        error_attributes=("exception.type", "error.type"),
        # openinference-instrumentation-langchain 0.1.80 dumps the tool's ToolMessage as {"type": "tool", "data": {...}}
        error_json=(("output.value", "data.status", "data.content"),),
    ),
    Convention(
        PYDANTIC_AI_V2,
        "agent",
        {"agent_name": frozenset()},
        name_attributes=("agent_name",),
        span_names=frozenset({"agent run"}),
    ),
    Convention(
        PYDANTIC_AI_V2,
        "tool",
        {"gen_ai.tool.name": frozenset()},
        name_attributes=("gen_ai.tool.name",),
        call_id_attributes=("gen_ai.tool.call.id",),
        arguments_attributes=("tool_arguments",),
        result_attributes=("tool_response",),
        span_names=frozenset({"running tool"}),
    ),
)


@dataclass(frozen=True)
class Match:
    """What a span says in agl's terms: an agent (name, key) or a tool (name, call id, arguments, result)."""

    convention: Convention
    name: str
    key: str | None = None
    call_id: str | None = None
    arguments: Any = None
    result: Any = None

    @property
    def kind(self) -> Kind:
        return self.convention.kind


def match(span_name: str, attributes: Mapping[str, Any] | None, kind: Kind | None = None) -> Match | None:
    """The first convention (of `kind`, if given) that marks this span, with what it names; None for other
    spans and for marked spans that name nothing."""
    attrs = attributes or {}
    for convention in CONVENTIONS:
        if kind is not None and convention.kind != kind:
            continue
        if convention.span_names and span_name not in convention.span_names:
            continue
        if convention.by_span_name and _from_span_name(span_name, convention) is None:
            continue
        if span_name in convention.excluded_span_names or any(key in attrs for key in convention.not_when):
            continue
        if not all(
            key in attrs and (not values or str(attrs[key]) in values) for key, values in convention.when.items()
        ):
            continue
        name = (
            _first(attrs, convention.name_attributes)
            or _from_json(attrs, convention.name_json)
            or _from_span_name(span_name, convention)
            or (span_name.strip() if convention.name_is_span_name else None)
        )
        if not name:
            continue
        return Match(
            convention,
            str(name),
            key=_text(_first(attrs, convention.key_attributes)),
            call_id=_text(_first(attrs, convention.call_id_attributes)),
            arguments=_first(attrs, convention.arguments_attributes),
            result=_first(attrs, convention.result_attributes),
        )
    return None


def error_type(attributes: Mapping[str, Any] | None, convention: Convention) -> str | None:
    """The failure the span's attributes name (`error.type`, OpenInference's `exception.type`, an error status in
    a JSON result), if any."""
    attrs = attributes or {}
    named = _text(_first(attrs, convention.error_attributes))
    if named is not None:
        return named
    for attribute, status_key, message_key in convention.error_json:
        if _from_json(attrs, ((attribute, status_key),)) == "error":
            return _text(_from_json(attrs, ((attribute, message_key),))) or "error"
    return None


def _first(attrs: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    for key in keys:
        value = attrs.get(key)
        if value is not None and value != "":
            return value
    return None


def _from_json(attrs: Mapping[str, Any], places: tuple[tuple[str, str], ...]) -> Any:
    """The first (attribute, dotted key) of `places` whose attribute holds a JSON object (as text, or a mapping)
    with a non-empty value at that key."""
    for attribute, key in places:
        value: Any = attrs.get(attribute)
        if isinstance(value, str):
            if not value.startswith("{"):
                continue
            try:
                value = json.loads(value)
            except ValueError:
                continue
        for part in key.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        if isinstance(value, (str, int)) and value != "":
            return value
    return None


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _from_span_name(span_name: str, convention: Convention) -> str | None:
    """The name a span's own name gives when its convention puts it there (`invoke_agent X`, `X.run`)."""
    if not (convention.name_prefix or convention.name_suffix):
        return None
    if not (span_name.startswith(convention.name_prefix) and span_name.endswith(convention.name_suffix)):
        return None
    name = span_name[len(convention.name_prefix) : len(span_name) - len(convention.name_suffix)].strip()
    return name or None
