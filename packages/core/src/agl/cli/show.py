"""`agl show ROLLOUT_ID`: one rollout as a readable tree.

The tree answers the questions people ask of a rollout when training misbehaves: did it succeed and with
which reward, which attempt counts, which agent made each LLM call (and which calls were *not* attributed or
not trainable), what tools did and whether they failed, and where each reward landed relative to the calls.
Everything here is pure rendering of a `RolloutDetail`, so it is tested without a server.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from pydantic import JsonValue
from rich.console import Group, RenderableType
from rich.markup import escape
from rich.text import Text
from rich.tree import Tree

from agl.common import attributes as attr
from agl.common import failure
from agl.schema import ALL_BYPASSED, LLMCall, Reward, RolloutDetail, Span, SpanStatus, all_bypassed
from agl.server.rollout_tree import Node, by_attempt, nest, pick_attempt

_STATUS_STYLE = {
    "queued": "dim",
    "running": "cyan",
    "succeeded": "green",
    "failed": "red",
    "timeout": "red",
    "lost": "yellow",
    "cancelled": "yellow",
}
_PREVIEW = 80  # characters of user text on one line: enough to recognise it, short enough not to wrap
_FULL_PREVIEW = 400  # with --full, message previews may be longer (still one line each)


# ------------------------------------------------------------------------------------------- formatting


def _status(status: str) -> str:
    return f"[{_STATUS_STYLE.get(status, 'white')}]{status}[/]"


def _preview(value: JsonValue, limit: int = _PREVIEW) -> str:
    """One escaped line of any JSON value: newlines folded, long text cut with an ellipsis."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(text.split())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return escape(text)


def _duration(start: float | None, end: float | None) -> str:
    if start is None:
        return "not started"
    if end is None:  # still running: the elapsed time is what one wants to know
        return f"{_seconds(time.time() - start)} so far"
    return _seconds(end - start)


def _seconds(s: float) -> str:
    s = max(s, 0.0)
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 60:
        return f"{s:.1f} s"
    return f"{int(s // 60)}m {int(s % 60):02d}s"


def _content_text(content: JsonValue) -> JsonValue:
    """The text of an OpenAI message `content`, which is a string or a list of typed parts."""
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
        return " ".join(str(p) for p in parts) if parts else content
    return content


# ---------------------------------------------------------------------------------------------- lines


def _agent_name(span: Span) -> str:
    # The agent scope records its own name; the span name ("agent:writer") is the fallback for OTLP spans.
    return str(span.attributes.get(attr.AGENT_NAME) or span.agent_name or span.name.removeprefix("agent:"))


def _span_label(span: Span) -> str:
    kind = span.attributes.get(attr.SPAN_KIND)
    took = f"[dim]{_duration(span.start_time, span.end_time)}[/]"
    failed = span.status is SpanStatus.error
    error = f"  [red]{_preview(span.status_message or 'error')}[/]" if failed else ""
    if kind == "agent":
        return f"[bold magenta]agent {escape(_agent_name(span))}[/]  {took}{error}"
    if kind == "tool":
        name = span.attributes.get(attr.TOOL_NAME) or span.name.removeprefix("tool:")
        # OpenTelemetry's "unset" only means nobody reported a failure, so it reads as ok.
        ok = "[red]error[/]" if span.status is SpanStatus.error else "[green]ok[/]"
        line = f"[bold blue]tool {escape(str(name))}[/] {ok}  {took}"
        if (args := span.attributes.get(attr.TOOL_ARGUMENTS)) is not None:
            line += f"  args={_preview(args, 60)}"
        if (result := span.attributes.get(attr.TOOL_RESULT)) is not None:
            line += f"  → {_preview(result, 60)}"
        # The ok/error word already says it failed; add the message only when there is one.
        return line + (error if span.status_message else "")
    return f"{escape(span.name)}  {took}{error}"


def _tokens(ids: list[int] | None) -> str:
    return "?" if ids is None else str(len(ids))  # None: the backend gave no ids, so the call cannot train


def _how(call: LLMCall) -> str:
    """The API the agent called and whether it streamed, when either is not a plain chat completion."""
    parts = ([] if call.route == "chat" else [call.route]) + (["streamed"] if call.stream else [])
    return f"[dim]{' '.join(parts)}[/]  " if parts else ""


def _llm_label(call: LLMCall) -> str:
    if call.agent_name:
        agent = escape(call.agent_name)
    elif call.attribution.lost:
        agent = "[bold red]⚠ agent name lost (HTTP client not patched by agl)[/]"
    else:
        agent = "[bold yellow]⚠ unattributed[/]"
    model = escape(call.model or call.model_requested or "?")
    version = f" v{call.model_version}" if call.model_version is not None else ""
    if call.model and call.model_requested and call.model_requested != call.model:  # the name the app gave
        version += f" [dim](asked for {escape(call.model_requested)})[/]"
    line = (
        f"[bold]LLM #{call.seq}[/]  agent={agent}  model={model}{version}  {_how(call)}"
        f"prompt {_tokens(call.prompt_ids)} tok → response {_tokens(call.response_ids)} tok  "
        f"[dim]{call.latency_s * 1000:.0f} ms[/]  finish={escape(call.finish_reason or '?')}"
    )
    if not call.trainable:
        line += f"  [yellow]✗ not trainable: {_preview(call.not_trainable_reason or 'unknown')}[/]"
    if call.status == "error":
        line += f"  [red]error {call.http_status}: {_preview(call.error or '')}[/]"
    return line


def _llm_full(call: LLMCall) -> list[str]:
    """With --full: the last message the agent sent and what the model answered."""
    lines: list[str] = []
    messages = call.request.get("messages")
    if isinstance(messages, list) and messages and isinstance(last := messages[-1], dict):
        role = escape(str(last.get("role", "?")))
        lines.append(f"[dim]{role} ▸[/] {_preview(_content_text(last.get('content')), _FULL_PREVIEW)}")
    msg = call.response_message or {}
    if msg.get("content"):
        lines.append(f"[dim]assistant ◂[/] {_preview(_content_text(msg['content']), _FULL_PREVIEW)}")
    tool_calls = msg.get("tool_calls")
    for tc in tool_calls if isinstance(tool_calls, list) else []:
        fn = tc.get("function") if isinstance(tc, dict) else None
        if isinstance(fn, dict):
            lines.append(f"[dim]tool call ◂[/] {escape(str(fn.get('name')))}({_preview(fn.get('arguments'), 200)})")
    return lines


def _reward_label(reward: Reward) -> str:
    after = f" after LLM #{reward.after_llm_seq}" if reward.after_llm_seq is not None else " before any LLM call"
    return f"[bold green]reward {escape(reward.name)}={reward.value:g}[/] ({reward.source.value}){after}"


# ------------------------------------------------------------------------------------------ the tree


@dataclass
class _Stats:
    calls: int = 0
    trainable: int = 0
    prompt_tokens: int = 0
    response_tokens: int = 0
    unattributed: int = 0
    missed: int = 0  # of the unattributed: agent name lost on the way (an HTTP client agl does not patch)
    spans: int = 0
    rewards: int = 0
    agents: set[str] = field(default_factory=set)

    def add_call(self, call: LLMCall) -> None:
        self.calls += 1
        self.trainable += call.trainable
        self.prompt_tokens += len(call.prompt_ids or [])
        self.response_tokens += len(call.response_ids or [])
        if call.agent_name:
            self.agents.add(call.agent_name)
        else:
            self.unattributed += 1
            self.missed += call.attribution.lost


def _fill(parent: Tree, nodes: list[Node], full: bool, stats: _Stats) -> None:
    for node in nodes:
        item = node.item
        if isinstance(item, Span):
            stats.spans += 1
            if item.attributes.get(attr.SPAN_KIND) == "agent":
                stats.agents.add(_agent_name(item))
            _fill(parent.add(_span_label(item)), node.children, full, stats)
        elif isinstance(item, LLMCall):
            stats.add_call(item)
            branch = parent.add(_llm_label(item))
            for line in _llm_full(item) if full else []:
                branch.add(line)
        else:
            stats.rewards += 1
            parent.add(_reward_label(item))


def render_rollout(detail: RolloutDetail, *, attempt: str | None = None, full: bool = False) -> RenderableType:
    """A tree of one rollout: header, one branch per attempt (the chosen one expanded), a summary line.

    `attempt` (an attempt id or number) picks the attempt to expand; by default the final one. `full`
    expands every attempt and adds message previews under each LLM call.
    """
    r = detail.rollout
    reward = f"reward [bold]{r.final_reward:g}[/]" if r.final_reward is not None else "[dim]no reward[/]"
    step = f" step {r.step}" if r.step is not None else ""
    header = [
        f"[bold]rollout {escape(r.id)}[/]  {_status(r.status.value)}"
        + (
            f"  [bold red]⚠ {ALL_BYPASSED} ({r.bypassed_llm_calls})[/]"
            if all_bypassed(r, len(detail.llm_calls))
            else ""
        ),
        f"task {escape(detail.task.id)}: {_preview(detail.task.input)}",
        f"{reward} · attempts {r.attempt_count}/{r.max_attempts} · {r.mode}{step} · "
        f"{_duration(r.started_at, r.ended_at)}",
    ]
    if r.error:
        header.append(f"[red]error: {_preview(failure.split(r.error)[0], _FULL_PREVIEW)}[/]")
    tree = Tree("\n".join(header), guide_style="dim")

    shown = pick_attempt(detail, attempt)
    stats = _Stats()
    for part in by_attempt(detail, shown):
        a = part.attempt
        final = "  [bold green]★ final[/]" if a.id == r.final_attempt_id else ""
        message, trace = failure.split(a.error) if a.error else ("", None)
        error = f"  [red]{_preview(message)}[/]" if message else ""
        label = (
            f"[bold]attempt #{a.number}[/] {escape(a.id)}  worker {escape(a.worker_id)}  "
            f"{_status(a.status.value)}  {_duration(a.started_at, a.ended_at)}{final}{error}"
        )
        if a.bypassed_llm_calls:
            label += (
                f"\n  [bold red]⚠ {a.bypassed_llm_calls} LLM call(s) bypassed agl (first:"
                f" {escape(a.bypassed_llm_url or '?')}): {escape(a.bypass_story())}[/]"
            )
        if a.external_llm_calls:
            label += f"\n  [dim]{a.external_llm_calls} call(s) to external LLMs (intended)[/]"
        if full or a.id == shown:
            branch = tree.add(label)
            if trace:  # where the agent failed, as Python printed it
                branch.add(Text(trace, style="red"))
            _fill(branch, nest(part.spans, part.calls, part.rewards), full, stats)
        else:
            # Retried attempts are rarely the interesting part; one line with their size is enough.
            tree.add(f"{label}  [dim]({len(part.calls)} LLM calls, {len(part.spans)} spans — collapsed)[/]")

    scope = (
        "all attempts" if full else "attempt " + next((f"#{a.number}" for a in detail.attempts if a.id == shown), "-")
    )
    unattributed = f" [yellow](⚠ {stats.unattributed} unattributed)[/]" if stats.unattributed else ""
    if stats.missed:
        unattributed += f" [bold red](⚠ {stats.missed} lost their agent name: HTTP client not patched by agl)[/]"
    summary = Text.from_markup(
        f"[dim]{scope}:[/] LLM calls {stats.trainable}/{stats.calls} trainable{unattributed} · "
        f"tokens {stats.prompt_tokens} prompt + {stats.response_tokens} response · "
        f"agents {escape(', '.join(sorted(stats.agents))) or '-'} · spans {stats.spans} · rewards {stats.rewards}"
    )
    return Group(tree, summary)
