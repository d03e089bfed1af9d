"""A step that selects agents and found none of their calls stops the run, naming the agents it saw; a step whose
selected agents called but had their calls left out for other reasons does not (issue #43)."""

from __future__ import annotations

from collections import Counter

import pytest

from agl.learn.selection import AgentSelection
from agl.learn.transitions import BuildStats
from agl_trainer.run.step_transitions import check_selection_found


def stats(kept: dict[str | None, int], dropped: dict[str | None, int]) -> BuildStats:
    return BuildStats(kept_by_agent=Counter(kept), dropped_by_agent=Counter(dropped))


def test_a_step_without_any_call_of_the_selected_agents_stops_the_run() -> None:
    with pytest.raises(ValueError, match=r"step 3 trained nothing.*writer.*speaker \(6\), unattributed \(2\)"):
        check_selection_found(stats({}, {"speaker": 6, None: 2}), AgentSelection.parse("writer"), 2)


@pytest.mark.parametrize(
    ("kept", "dropped", "selected"),
    [
        ({"writer": 1}, {"speaker": 6}, "writer"),  # trained something
        ({}, {"writer": 2, "speaker": 6}, "writer"),  # the writer called; its calls were too long, or not trainable
        ({}, {"team.writer": 2}, "team.*"),  # a pattern that matches
        ({}, {"speaker": 6}, None),  # every agent selected: nothing to check
        ({}, {}, "writer"),  # no call at all (every rollout failed): the step line says so
    ],
)
def test_other_steps_go_on(kept: dict[str | None, int], dropped: dict[str | None, int], selected: str | None) -> None:
    check_selection_found(stats(kept, dropped), AgentSelection.parse(selected), 0)
