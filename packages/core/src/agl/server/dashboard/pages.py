"""The dashboard's HTML, rendered on the server: plain pages that work without JavaScript; `static/app.js` only
draws the learning curve and refreshes the overview's counts while a run trains. Every value from the run is
escaped (agents' text is untrusted)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import Any
from urllib.parse import urlencode

from agl.common import attributes as attr
from agl.common import failure
from agl.schema import ALL_BYPASSED, LLMCall, Reward, RolloutDetail, RolloutStatus, Span, SpanStatus, all_bypassed
from agl.server.dashboard.queries import Page, RolloutFilter
from agl.server.rollout_tree import Node, by_attempt, nest, pick_attempt

MODES = ("train", "eval")


def _e(value: Any) -> str:
    return escape("" if value is None else str(value))


def _when(ts: float | None) -> str:
    return "—" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _took(start: float | None, end: float | None) -> str:
    if start is None:
        return "—"
    return f"{(end if end is not None else time.time()) - start:.1f} s"


def _reward(value: float | None) -> str:
    return "—" if value is None else f"{value:g}"


def layout(title: str, body: str, *, active: str) -> str:
    nav = "".join(
        f'<a href="{href}"{" class=active" if name == active else ""}>{label}</a>'
        for name, href, label in (("overview", "/ui", "Overview"), ("rollouts", "/ui/rollouts", "Rollouts"))
    )
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name=viewport content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)} · agl</title>"
        # no favicon request: /favicon.ico is outside /ui, where the dashboard's cookie does not go
        '<link rel=icon href="data:,">'
        '<link rel=stylesheet href="/ui/static/app.css"><script defer src="/ui/static/app.js"></script></head>'
        f"<body><header><span class=brand>agl</span><nav>{nav}</nav></header><main>{body}</main></body></html>"
    )


# ------------------------------------------------------------------------------------------------ overview


def _steps_table(steps: Sequence[Mapping[str, Any]]) -> str:
    """The last training steps: reward, transitions, their staleness, the importance weights, overlap."""

    def num(value: Any, fmt: str) -> str:
        return format(value, fmt) if isinstance(value, (int, float)) else ""

    def ages(value: Any) -> str:
        return " ".join(f"{_e(k)}:{_e(v)}" for k, v in value.items()) if isinstance(value, dict) else ""

    rows = "".join(
        f"<tr><td>{_e(r['step'])}</td><td>{num(r['reward_mean'], '.3f')}</td><td>{num(r['transitions'], 'd')}</td>"
        f"<td>{ages(r['staleness'])}</td><td>{num(r['update_is_weight_mean'], '.3f')}</td>"
        f"<td>{num(r['update_is_weight_max'], '.2f')}</td><td>{num(r['engine_busy'], '.0%')}</td>"
        f"<td>{num(r['trainer_busy'], '.0%')}</td><td>{num(r['tokens_per_s'], '.0f')}</td>"
        f"<td>{num(r['step_s'], '.1f')}</td></tr>"
        for r in steps
    )
    head = (
        "<tr><th>step</th><th>reward</th><th>transitions</th><th title='transitions by how many versions older than "
        "the updated policy their calls were sampled'>staleness</th><th>IS weight mean</th><th>IS weight max</th>"
        "<th>engine busy</th><th>trainer busy</th><th>tokens/s</th><th>step (s)</th></tr>"
    )
    return f"<table id=steps><thead>{head}</thead><tbody>{rows}</tbody></table>"


def _engines_table(engines: Sequence[Mapping[str, Any]]) -> str:
    """The engines the proxy routes over (agl.server.engines): their use since the server started."""
    rows = "".join(
        f"<tr data-engine='{_e(e['url'])}'><td>{_e(e['url'])}</td><td>{'yes' if e['in_rotation'] else 'no'}</td>"
        f"<td>{e['in_flight']}</td><td>{e['calls']}</td><td>{e['completion_tokens']}</td>"
        f"<td>{e['busy_s']:.1f}</td><td>{e['failures']}</td><td>{_e(e['last_error'] or '')}</td></tr>"
        for e in engines
    )
    return (
        "<table><thead><tr><th>engine</th><th>in rotation</th><th>in flight</th><th>calls</th>"
        "<th>tokens generated</th><th>busy (s)</th><th>failures</th><th>last error</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )


def _workers_table(nodes: Sequence[Mapping[str, Any]]) -> str:
    """Per node: its workers and their attempts (agl.server.dashboard.queries.workers_by_node)."""
    rows = "".join(
        f"<tr data-node='{_e(n['node'])}'><td>{_e(n['node'])}</td><td>{n['workers']}</td><td>{n['claimed']}</td>"
        f"<td>{n['running']}</td><td>{n['finished']}</td><td>{n['failed']}</td></tr>"
        for n in nodes
    )
    return (
        "<table><thead><tr><th>node</th><th>workers</th><th>attempts claimed</th><th>running</th><th>finished</th>"
        f"<th>failed or lost</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def overview(
    run_name: str,
    counts: Mapping[str, Any],
    curve: Mapping[str, list[list[float]]],
    steps: Sequence[Mapping[str, Any]] = (),
    engines: Sequence[Mapping[str, Any]] = (),
) -> str:
    statuses = counts["rollouts_by_status"]
    cards = "".join(
        f'<a class="card {s.value}" href="/ui/rollouts?status={s.value}"><b data-count="{s.value}">'
        f"{statuses.get(s.value, 0)}</b><span>{s.value}</span></a>"
        for s in RolloutStatus
    )
    calls = counts["llm_calls_by_attribution"]
    unattributed = calls.get("unattributed", 0) + calls.get("unhooked", 0) + calls.get("missed", 0)
    versions = "".join(
        f"<tr><td>v{_e(v['version'])}</td><td>{_e(v['name'])}</td><td>{_e(v['upstream_model'])}</td>"
        f"<td>{_when(v['created_at'])}</td></tr>"
        for v in counts["model_versions"]
    )
    points = sum(len(v) for v in curve.values())
    return layout(
        "overview",
        f"<h1>Run {_e(run_name)}</h1>"
        f'<section class=cards id=counts data-src="/ui/api/overview">{cards}</section>'
        f"<p class=facts><span>rollouts <b data-count=rollouts>{counts['rollouts']}</b></span>"
        f"<span>last step <b data-count=last_step>{_e(counts['last_step'])}</b></span>"
        f"<span>LLM calls <b data-count=llm_calls>{counts['llm_calls']}</b></span>"
        f"<span>unattributed calls <b data-count=unattributed>{unattributed}</b></span>"
        f"<span>not trainable <b data-count=untrainable_calls>{counts['untrainable_calls']}</b></span></p>"
        "<h2>Learning curve</h2>"
        f'<figure id=curve data-src="/ui/api/curve" data-points="{points}">'
        "<svg viewBox='0 0 640 300' role=img aria-label='learning curve'></svg>"
        "<figcaption>train reward (mean), train success rate and held-out accuracy by step; "
        "updated while the run trains</figcaption>"
        f"<script type=application/json id=curve-data>{_json_for_script(curve)}</script></figure>"
        + ("<h2>Training steps</h2>" + _steps_table(steps) if steps else "")
        + ("<h2>Engines</h2>" + _engines_table(engines) if len(engines) > 1 else "")
        + (
            "<h2>Workers by node</h2>" + _workers_table(counts["workers_by_node"])
            if counts.get("workers_by_node")
            else ""
        )
        + "<h2>Model versions</h2>"
        + (
            f"<table><thead><tr><th>version</th><th>name</th><th>served as</th><th>published</th></tr></thead>"
            f"<tbody>{versions}</tbody></table>"
            if versions
            else "<p class=muted>none published yet</p>"
        ),
        active="overview",
    )


def _json_for_script(value: Any) -> str:
    # inside <script>, "</" would end the element: JSON allows escaping the slash
    return json.dumps(value).replace("</", "<\\/")


# -------------------------------------------------------------------------------------------- rollouts table


def _options(values: Iterable[str], chosen: str | None, blank: str) -> str:
    out = [f'<option value="">{blank}</option>']
    out += [f"<option{' selected' if v == chosen else ''}>{_e(v)}</option>" for v in values]
    return "".join(out)


def filter_query(flt: RolloutFilter, **extra: str) -> str:
    pairs = {k: v for k, v in vars(flt).items() if v is not None}
    pairs.update(extra)
    return urlencode(pairs)


def rollouts(page: Page, flt: RolloutFilter, agents: list[str], *, first_page: bool) -> str:
    form = (
        "<form class=filters method=get action=/ui/rollouts>"
        f"<label>status <select name=status>{_options([s.value for s in RolloutStatus], flt.status, 'any')}"
        "</select></label>"
        f"<label>mode <select name=mode>{_options(MODES, flt.mode, 'any')}</select></label>"
        f"<label>step <input name=step type=number min=0 value='{_e(flt.step)}'></label>"
        f"<label>agent <select name=agent>{_options(agents, flt.agent, 'any')}</select></label>"
        f"<label>reward ≥ <input name=min_reward type=number step=any value='{_e(flt.min_reward)}'></label>"
        f"<label>reward ≤ <input name=max_reward type=number step=any value='{_e(flt.max_reward)}'></label>"
        "<button type=submit>Filter</button> <a href=/ui/rollouts>clear</a></form>"
    )
    rows = "".join(
        f"<tr class={_e(r.status)}><td><a href='/ui/rollouts/{_e(r.id)}'>{_e(r.id)}</a></td>"
        f"<td><span class='status {_e(r.status)}'>{_e(r.status)}</span></td><td>{_e(r.mode)}</td>"
        f"<td>{_e(r.step)}</td><td>{r.attempts}</td><td class=num>{_reward(r.reward)}</td>"
        f"<td>{_when(r.created_at)}</td><td>{_took(r.started_at, r.ended_at)}</td>"
        f"<td class=error>{_e(failure.split(r.error)[0][:120]) if r.error else ''}</td></tr>"
        for r in page.rows
    )
    pager = []
    if not first_page:
        pager.append(f"<a href='/ui/rollouts?{_e(filter_query(flt))}'>first page</a>")
    if page.next_cursor is not None:
        pager.append(f"<a rel=next href='/ui/rollouts?{_e(filter_query(flt, after=page.next_cursor))}'>next page</a>")
    table = (
        "<table id=rollouts><thead><tr><th>rollout</th><th>status</th><th>mode</th><th>step</th><th>attempts</th>"
        f"<th>reward</th><th>created</th><th>took</th><th>error</th></tr></thead><tbody>{rows}</tbody></table>"
        if rows
        else "<p class=muted id=rollouts>no rollouts match</p>"
    )
    return layout(
        "rollouts",
        f"<h1>Rollouts</h1>{form}<p class=muted><span id=total>{page.total}</span> match</p>{table}"
        f"<p class=pager>{' · '.join(pager)}</p>",
        active="rollouts",
    )


# ------------------------------------------------------------------------------------------------ one rollout


def _messages(call: LLMCall) -> str:
    messages = call.request.get("messages")
    items = []
    for m in messages if isinstance(messages, list) else []:
        if isinstance(m, dict):
            content = m.get("content")
            text = content if isinstance(content, str) else json.dumps(content)
            calls = m.get("tool_calls")
            extra = f"\n→ tool calls {json.dumps(calls)}" if calls else ""
            items.append(f"<div class=msg><b>{_e(m.get('role'))}</b><pre>{_e(text)}{_e(extra)}</pre></div>")
    answer = call.response_message or {}
    said = answer.get("content")
    text = said if isinstance(said, str) else json.dumps(said) if said else ""
    tool_calls = answer.get("tool_calls")
    extra = f"\n→ tool calls {json.dumps(tool_calls)}" if tool_calls else ""
    items.append(f"<div class='msg answer'><b>answer</b><pre>{_e(text)}{_e(extra)}</pre></div>")
    return "".join(items)


def _call(call: LLMCall) -> str:
    agent = _e(call.agent_name) if call.agent_name else "<span class=warn>unattributed</span>"
    key = f" <span class=muted>(key {_e(call.agent_key)})</span>" if call.agent_key else ""
    tokens = f"{len(call.prompt_ids or [])} → {len(call.response_ids or [])} tokens"
    trainable = "" if call.trainable else f" <span class=warn>not trainable: {_e(call.not_trainable_reason)}</span>"
    error = f" <span class=bad>error {call.http_status}: {_e(call.error)}</span>" if call.status == "error" else ""
    how = f"{_e(call.route)}{', streamed' if call.stream else ''}"
    return (
        f"<details class=llm><summary><b>LLM #{call.seq}</b> agent {agent}{key} · {how} · {tokens} · "
        f"{call.latency_s * 1000:.0f} ms · finish {_e(call.finish_reason)}{trainable}{error}</summary>"
        f"{_messages(call)}</details>"
    )


def _span(span: Span) -> str:
    kind = span.attributes.get(attr.SPAN_KIND) or span.kind
    failed = span.status is SpanStatus.error
    status = "<span class=bad>error</span>" if failed else "<span class=good>ok</span>"
    message = f" <span class=bad>{_e(span.status_message)}</span>" if failed and span.status_message else ""
    if kind == "tool":
        name = span.attributes.get(attr.TOOL_NAME) or span.name.removeprefix("tool:")
        args = span.attributes.get(attr.TOOL_ARGUMENTS)
        shown = f" <code>{_e(str(args)[:200])}</code>" if args is not None else ""
        return f"<span class=tool>tool <b>{_e(name)}</b></span> {status}{shown}{message}"
    if kind == "agent":
        return (
            f"<span class=agent>agent <b>{_e(span.agent_name or span.name.removeprefix('agent:'))}</b></span>{message}"
        )
    return f"{_e(span.name)}{message}"


def _reward_item(reward: Reward) -> str:
    after = f"after LLM #{reward.after_llm_seq}" if reward.after_llm_seq is not None else "before any LLM call"
    return (
        f"<span class='reward {_e(reward.source.value)}'>reward <b>{_e(reward.name)} = {reward.value:g}</b></span>"
        f" <span class=muted>{_e(reward.source.value)}, {after}</span>"
    )


def _tree(nodes: list[Node]) -> str:
    items = []
    for node in nodes:
        item = node.item
        if isinstance(item, Span):
            items.append(f"<li>{_span(item)}{_tree(node.children)}</li>")
        elif isinstance(item, LLMCall):
            items.append(f"<li>{_call(item)}</li>")
        else:
            items.append(f"<li>{_reward_item(item)}</li>")
    return f"<ul class=tree>{''.join(items)}</ul>" if items else ""


def _transitions(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "<p class=muted>no trained calls of this rollout (not trained yet, not selected, or an evaluation)</p>"

    def num(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, (int, float)) else "—"

    body = "".join(
        f"<tr><td>#{_e(r.get('seq'))}</td><td>{_e(r.get('agent'))}</td><td class=num>{num(r.get('reward'))}</td>"
        f"<td class=num>{num(r.get('return'))}</td><td class=num>{num(r.get('advantage'))}</td>"
        f"<td class=num>{num(r.get('weight'))}</td><td class=num>{_e(r.get('prompt_tokens'))} → "
        f"{_e(r.get('response_tokens'))}</td></tr>"
        for r in rows
    )
    return (
        "<table id=transitions><thead><tr><th>call</th><th>agent</th><th>reward</th><th>return</th>"
        f"<th>advantage</th><th>weight</th><th>tokens</th></tr></thead><tbody>{body}</tbody></table>"
    )


def rollout(detail: RolloutDetail, transitions: list[dict[str, Any]]) -> str:
    r = detail.rollout
    shown = pick_attempt(detail)
    attempts = []
    for part in by_attempt(detail, shown):
        a = part.attempt
        message, trace = failure.split(a.error) if a.error else ("", None)
        final = " <span class=good>★ final</span>" if a.id == r.final_attempt_id else ""
        head = (
            f"<summary><b>attempt #{a.number}</b> {_e(a.id)} · worker {_e(a.worker_id)} · "
            f"<span class='status {_e(a.status.value)}'>{_e(a.status.value)}</span> · {_took(a.started_at, a.ended_at)}"
            f"{final}{f' <span class=bad>{_e(message)}</span>' if message else ''}</summary>"
        )
        trace_html = f"<pre class=traceback>{_e(trace)}</pre>" if trace else ""
        if a.bypassed_llm_calls:
            trace_html = (
                f"<p class=bad>⚠ {a.bypassed_llm_calls} LLM call(s) bypassed agl (first: {_e(a.bypassed_llm_url)}):"
                f" {_e(a.bypass_story())}</p>" + trace_html
            )
        if a.external_llm_calls:
            trace_html = f"<p class=muted>{a.external_llm_calls} call(s) to external LLMs (intended)</p>" + trace_html
        tree = _tree(nest(part.spans, part.calls, part.rewards)) or "<p class=muted>nothing recorded</p>"
        attempts.append(f"<details class=attempt{' open' if a.id == shown else ''}>{head}{trace_html}{tree}</details>")
    error = f"<p class=bad>{_e(failure.split(r.error)[0])}</p>" if r.error else ""
    body = (
        f"<h1>Rollout {_e(r.id)} <span class='status {_e(r.status.value)}'>{_e(r.status.value)}</span>"
        + (
            f" <span class=bad>⚠ {ALL_BYPASSED} ({r.bypassed_llm_calls})</span>"
            if all_bypassed(r, len(detail.llm_calls))
            else ""
        )
        + "</h1>"
        f"<p class=facts><span>reward <b id=final-reward>{_reward(r.final_reward)}</b></span>"
        f"<span>{_e(r.mode)}</span><span>step {_e(r.step)}</span>"
        f"<span>attempts {r.attempt_count}/{r.max_attempts}</span><span>took {_took(r.started_at, r.ended_at)}</span>"
        f"<span>LLM calls {len(detail.llm_calls)}</span></p>{error}"
        f"<h2>Task {_e(detail.task.id)}</h2><pre class=task>{_e(json.dumps(detail.task.input, indent=2))}</pre>"
        f"<h2>Attempts</h2>{''.join(attempts)}"
        f"<h2>Transitions</h2>{_transitions(transitions)}"
    )
    return layout(f"rollout {r.id}", body, active="rollouts")
