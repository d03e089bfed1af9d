"""What the worker says when a train rollout's LLM calls were stored not trainable for the way its agent sampled them
(`temperature: 0` as Aider and BeeAI send, a top-p, penalties): the run trains none of them. That happens only where
the run does not own the agent's sampling (`agl train --keep-agent-sampling`, or `agl serve` without
`--own-sampling-for`); the server's answer to the attempt's report says which calls (agl.store.reads), and the
trainer's step line counts them among its dropped calls. Said once per worker for each agent."""

from __future__ import annotations

import logging
from collections.abc import Sequence

log = logging.getLogger("agl.worker")

_warned: set[str | None] = set()


def warn_untrainable_sampling(rollout_id: str, found: Sequence[tuple[str | None, int, str]]) -> None:
    """After a train rollout: (agent, calls, one reason) from the server; once per worker for each agent."""
    for agent, calls, reason in found:
        if agent in _warned:
            continue
        _warned.add(agent)
        who = f"agent {agent!r}" if agent is not None else "an unnamed agent"
        let_run = f"agl serve --own-sampling-for {agent}" if agent is not None else "agl serve --own-sampling-for NAME"
        log.warning(
            "%d LLM call(s) of %s in train rollout %s were stored not trainable: %s. The agent chose its own"
            " sampling and the run does not own it, so it trains none of them. Let the run sample this agent's"
            " training calls (agl train does unless --keep-agent-sampling; `%s`), or send the run's temperature"
            " from the agent. (Said once per worker for each agent.)",
            calls,
            who,
            rollout_id,
            reason,
            let_run,
        )
