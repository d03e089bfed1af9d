"""`agl export --agents SELECTION`: the transitions a selection keeps, built by the same code as `agl train`, and
a summary of what it keeps and drops (per agent, per reason) — to check a selection before training with it."""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from typing import IO, Any

import orjson
from rich.console import Console
from rich.table import Table

from agl.client import Client
from agl.learn.selection import AgentSelection
from agl.learn.transitions import BuildStats, Episode, build_episodes
from agl.schema import RolloutStatus

PAGE = 500  # rollouts per request: details of 500 rollouts are a few MB at most


def _episodes(client: Client, selection: AgentSelection, step: int | None, stats: BuildStats) -> Iterator[Episode]:
    """Episodes of the finished rollouts (succeeded or failed; running ones may still add calls), page by page."""
    for status in (RolloutStatus.succeeded, RolloutStatus.failed):
        offset = 0
        while True:
            rollouts, total = client.list_rollouts(status=status.value, step=step, limit=PAGE, offset=offset)
            if not rollouts:
                break
            episodes, page_stats = build_episodes(client.trainable_rollouts([r.id for r in rollouts]), selection)
            stats.merge(page_stats)
            yield from episodes
            offset += len(rollouts)
            if offset >= total:
                break


def _listed(value: object) -> list[Any]:
    """Packed id and log-prob arrays (agl.common.trainable) as JSON lists."""
    if isinstance(value, array):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def export_transitions(
    client: Client, selection: AgentSelection, out: IO[bytes], *, step: int | None = None
) -> BuildStats:
    """Write one JSON line per transition the selection keeps; returns the counts of what it kept and dropped."""
    stats = BuildStats()
    for episode in _episodes(client, selection, step, stats):
        for t in episode.transitions:
            row = {
                "rollout_id": t.rollout_id,
                "task_id": t.task_id,
                "attempt_id": t.attempt_id,
                "seq": t.seq,
                "agent_name": t.agent_name,
                "model_version": t.model_version,
                "reward": t.reward,
                "temperature": t.temperature,
                "prompt_ids": t.prompt_ids,
                "response_ids": t.response_ids,
                "logprobs": t.logprobs,
                "call_ids": t.call_ids,
            }
            out.write(orjson.dumps(row, default=_listed) + b"\n")
    return stats


def selection_summary(selection: AgentSelection, stats: BuildStats) -> Table:
    """Per agent: calls kept and dropped; then why calls and rollouts were left out."""
    table = Table(title=f"selection: {selection}", show_edge=False)
    table.add_column("agent")
    table.add_column("selected")
    table.add_column("calls kept", justify="right")
    table.add_column("calls dropped", justify="right")
    for agent in stats.stored_agent_names:  # those of rollouts left out too (failed, no reward)
        table.add_row(
            agent if agent is not None else "(unattributed)",
            # kept calls: selected by the agent's name or by its key (a second name, see agl.agent)
            "yes" if agent is not None and (selection.selects(agent) or stats.kept_by_agent[agent]) else "no",
            str(stats.kept_by_agent[agent]),
            str(stats.dropped_by_agent[agent] + stats.in_dropped_rollouts[agent]),
        )
    for title, counter in (("calls left out", stats.dropped_calls), ("rollouts left out", stats.dropped_rollouts)):
        for reason, count in counter.most_common():
            table.add_row(f"[dim]{title}: {reason}[/dim]", "", "", str(count))
    return table


def print_summary(selection: AgentSelection, stats: BuildStats, console: Console) -> None:
    console.print(selection_summary(selection, stats))
    if selection.agents is not None and not stats.kept_by_agent:
        names = ", ".join(str(a) for a in stats.stored_agent_names if a is not None) or "none"
        console.print(
            f"[yellow]the selection kept no call; agent names stored in these rollouts: {names}[/yellow]",
            soft_wrap=True,
        )
    for name, count in stats.generic_names.most_common():
        console.print(
            f"[yellow]{count} calls are stored under the framework's generic name {name!r}: agents created without "
            "a name (LangChain: create_agent(..., name='writer')) cannot be told apart or selected[/yellow]",
            soft_wrap=True,
        )
    console.print(f"{stats.transitions} transitions from {stats.episodes} of {stats.rollouts} rollouts")
    dropped = sum(stats.dropped_rewards.values())
    if dropped:  # rewards of kept rollouts that no transition received: never silently
        console.print(
            f"[yellow]{dropped} reward(s) dropped: "
            + ", ".join(f"{why} {n}" for why, n in stats.dropped_rewards.most_common())
            + " (placed before any kept LLM call of their attempt: emitted before the first call, or after calls"
            " only of agents the selection leaves out)[/yellow]",
            soft_wrap=True,
        )
    else:
        console.print("rewards dropped: 0")
    if stats.dropped_rollouts:  # why the others gave none: e.g. "every LLM call bypassed agl 3", not a selection
        console.print("rollouts left out, and why:", soft_wrap=True)
        for why, n in stats.dropped_rollouts.most_common():
            ids = stats.dropped_rollout_ids.get(why, [])
            more = f" and {n - len(ids)} more" if n > len(ids) else ""
            console.print(f"  {why}: {n} ({', '.join(ids)}{more})", soft_wrap=True)
