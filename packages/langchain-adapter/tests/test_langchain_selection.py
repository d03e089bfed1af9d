"""`AgentSelection` picks whose calls become transitions, by the exact node names the handler gave them."""

from __future__ import annotations

from collections import Counter

from lc_support import TASK, calls, load_example, run_rollout

from agl.client import Client
from agl.common.processes import ServerProcess
from agl.learn.selection import AgentSelection
from agl.learn.transitions import build_episodes

example = load_example()


def test_only_selected_agents_calls_become_transitions(agl_server: ServerProcess, agl_client: Client) -> None:
    detail = run_rollout(example.write_essay, agl_server, agl_client, TASK)
    # every call is stored, the checker's included
    assert Counter(c.agent_name for c in calls(detail)) == {"checker": 4, "writer": 1, "rewriter": 1}

    (episode,), stats = build_episodes([detail], AgentSelection.parse("writer,rewriter"))
    assert [t.agent_name for t in episode.transitions] == ["writer", "rewriter"]
    assert sum(stats.dropped_calls.values()) == 4  # the checker's calls, counted as left out
    assert episode.transitions[-1].reward == 1.0  # the final reward still reaches the selected agents

    (episode,), _ = build_episodes([detail], AgentSelection.parse("checker"))
    assert [t.agent_name for t in episode.transitions] == ["checker"] * 4

    (episode,), _ = build_episodes([detail], AgentSelection.parse(None))
    assert len(episode.transitions) == 6
