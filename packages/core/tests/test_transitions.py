"""Stored rollouts → transitions: order, reward placement, selection, drops that are counted, prefix merging."""

from __future__ import annotations

import pytest
from factories import Call, Rew, Run, detail

from agl.learn.selection import AgentSelection
from agl.learn.transitions import build_episode, build_episodes
from agl.schema import RolloutStatus


def test_calls_become_ordered_transitions_with_rewards_where_they_happened() -> None:
    run = Run(
        "t",
        [Call([1, 2], [3]), Call([1, 2, 3, 4], [5, 6]), Call([7], [8])],
        rewards=[Rew(0.1, 0), Rew(0.2, 0), Rew(-0.3, 2)],
        final=1.0,
    )
    ep = build_episode(detail(run))
    assert ep is not None
    assert [t.seq for t in ep.transitions] == [0, 1, 2]
    assert [t.prompt_ids for t in ep.transitions] == [[1, 2], [1, 2, 3, 4], [7]]
    assert [t.response_mask for t in ep.transitions] == [[1], [1, 1], [1]]
    assert [t.reward for t in ep.transitions] == pytest.approx([0.3, 0.0, 0.7])  # -0.3 + 1.0 on the last
    assert ep.final_reward == 1.0 and ep.total_reward == pytest.approx(1.0)


def test_rewards_go_to_the_last_selected_transition_before_them() -> None:
    run = Run(
        "t",
        [Call([1], [2], agent="critic"), Call([3], [4]), Call([5], [6], agent="critic"), Call([7], [8])],
        rewards=[Rew(0.5, 0), Rew(0.25, 2), Rew(0.125, None)],
        final=None,
    )
    d = detail(run)
    ep = build_episode(d, AgentSelection.parse("solver"))
    assert ep is not None
    assert [t.seq for t in ep.transitions] == [1, 3]
    # 0.5 came after call 0 (before any solver call): not credited; 0.25 after call 2 → the solver's call 1
    assert [t.reward for t in ep.transitions] == [0.25, 0.0]
    _, stats = build_episodes([d], AgentSelection.parse("solver"))
    assert stats.dropped_rewards["before the first transition"] == 2  # after call 0, and before any call
    assert stats.dropped_calls["agent not selected"] == 2


def test_selection_leaves_out_unattributed_calls_only_when_agents_are_named() -> None:
    d = detail(Run("t", [Call([1], [2], agent=None), Call([3], [4], agent="writer")]))
    everything = build_episode(d)
    assert everything is not None and [t.agent_name for t in everything.transitions] == [None, "writer"]
    _, stats = build_episodes([d], AgentSelection.parse("writer"))
    assert stats.transitions == 1 and stats.dropped_calls["unattributed"] == 1


def test_nothing_is_filled_in_drops_are_counted() -> None:
    details = [
        detail(Run("a", [Call([1], [2])], final=None)),  # no reward at all
        detail(Run("b", [Call([1], [2])], status=RolloutStatus.failed)),
        detail(Run("c", [Call([1], [2], trainable=False)])),
        detail(Run("d", [Call([1], [2], status="error"), Call([3], [4])])),
        detail(Run("e", [Call([1] * 50, [2] * 60), Call([3], [4])])),
        detail(Run("f", [Call([1], [2])], rewards=[Rew(0.5, 0)], final=None)),  # intermediate only: kept
    ]
    episodes, stats = build_episodes(details, max_tokens=100)
    assert [e.task_id for e in episodes] == ["d", "e", "f"]
    assert stats.rollouts == 6 and stats.episodes == 3
    assert stats.dropped_rollouts == {"no reward": 1, "rollout failed": 1, "no trainable call of a selected agent": 1}
    assert stats.dropped_calls == {
        "not trainable: the backend returned no token ids": 1,
        "call failed": 1,
        "longer than max_tokens": 1,
    }
    assert episodes[2].final_reward is None and episodes[2].total_reward == 0.5
    assert "3/6 rollouts" in stats.summary() and "no reward 1" in stats.summary()


def test_prefix_merging_joins_a_growing_chat_and_masks_what_the_environment_added() -> None:
    run = Run(
        "t",
        [
            Call([1, 2], [3], logprobs=[-0.1]),
            Call([1, 2, 3, 9, 9], [4, 5], logprobs=[-0.2, -0.3]),  # extends the first: merged
            Call([6], [7], logprobs=[-0.4]),  # a new chat: kept apart
        ],
        rewards=[Rew(0.5, 0)],
        final=1.0,
    )
    ep = build_episode(detail(run), merge_prefixes=True)
    assert ep is not None and len(ep.transitions) == 2
    merged, other = ep.transitions
    assert merged.prompt_ids == [1, 2]
    assert list(merged.response_ids) == [3, 9, 9, 4, 5]  # merged turns are packed arrays
    assert merged.response_mask == [1, 0, 0, 1, 1]
    assert merged.logprobs is not None and list(merged.logprobs) == [-0.1, 0.0, 0.0, -0.2, -0.3]
    assert merged.reward == 0.5 and other.reward == 1.0
    assert len(merged.call_ids) == 2
    _, stats = build_episodes([detail(run)], merge_prefixes=True)
    assert stats.merged_calls == 1 and stats.transitions == 2


def test_prefix_merging_needs_the_exact_tokens_and_the_same_agent() -> None:
    not_prefix = Run("t", [Call([1, 2], [3]), Call([1, 2, 4, 9], [5])])  # response 3 is not in the next prompt
    other_agent = Run("t", [Call([1, 2], [3]), Call([1, 2, 3, 9], [5], agent="critic")])
    for run in (not_prefix, other_agent):
        ep = build_episode(detail(run), merge_prefixes=True)
        assert ep is not None and len(ep.transitions) == 2


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", None),
        ("*", None),
        (" writer , rewriter ", frozenset({"writer", "rewriter"})),
        (["a", "b"], frozenset({"a", "b"})),
    ],
)
def test_selection_parsing(value: object, expected: frozenset[str] | None) -> None:
    assert AgentSelection.parse(value).agents == expected  # type: ignore[arg-type]


def test_selection_resolution_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGL_TRAIN_AGENTS", "from_env")
    assert AgentSelection.resolve().agents == {"from_env"}
    assert AgentSelection.resolve(config_value="from_config").agents == {"from_config"}
    assert AgentSelection.resolve("from_kwarg", "from_config").agents == {"from_kwarg"}
    monkeypatch.delenv("AGL_TRAIN_AGENTS")
    assert AgentSelection.resolve().agents is None
    with pytest.raises(ValueError, match="not valid"):
        AgentSelection.parse("writer,*")


def test_missing_or_misaligned_log_probs_are_counted_and_the_sampling_temperature_is_kept() -> None:
    d = detail(Run("t", [Call([1], [2, 3]), Call([4], [5, 6], logprobs=[-0.1]), Call([7], [8])]))
    d.llm_calls[0].logprobs = None  # the backend sent none
    d.llm_calls[2].temperature = 0.7
    (episode,), stats = build_episodes([d])
    first, misaligned, tempered = episode.transitions
    assert first.logprobs is None and misaligned.logprobs is None and tempered.logprobs == [-0.5]
    assert stats.missing_logprobs == {"none from the backend": 1, "not one per response token": 1}
    assert "log-probs to recompute" in stats.summary()
    assert [t.temperature for t in episode.transitions] == [1.0, 1.0, 0.7]


def test_prefix_merging_keeps_turns_sampled_at_different_temperatures_apart() -> None:
    d = detail(Run("t", [Call([1, 2], [3]), Call([1, 2, 3, 9], [4])]))
    d.llm_calls[1].temperature = 0.5
    (episode,), stats = build_episodes([d], merge_prefixes=True)
    assert len(episode.transitions) == 2 and stats.merged_calls == 0


def test_selection_patterns_match_whole_names_case_sensitively() -> None:
    # CrewAI's template interpolates the topic into the role, so one agent has a new name per task
    selection = AgentSelection.parse("*Senior Data Researcher,writer")
    assert selection.patterns == ("*Senior Data Researcher",) and selection.names == {"writer"}
    assert selection.selects("AI LLMs Senior Data Researcher")
    assert selection.selects("Senior Data Researcher")
    assert selection.selects("writer")
    assert not selection.selects("Senior Data Researcher's helper")  # the whole name must match
    assert not selection.selects("ai llms senior data researcher")  # case-sensitive, like exact names
    assert not selection.selects("rewriter")  # exact entries stay exact
    assert not selection.selects(None)
    assert AgentSelection.parse("solver_[12]").selects("solver_2")
    assert not AgentSelection.parse("solver_[12]").selects("solver_3")


def test_selection_patterns_pick_calls_in_episodes() -> None:
    researcher, analyst = "AI LLMs Senior Data Researcher", "AI LLMs Reporting Analyst"
    d = detail(Run("t", [Call([1], [2], agent=researcher), Call([3], [4], agent=analyst)], final=1.0))
    ep = build_episode(d, AgentSelection.parse("*Researcher"))
    assert ep is not None and [t.agent_name for t in ep.transitions] == [researcher]
    _, stats = build_episodes([d], AgentSelection.parse("*Researcher"))
    assert stats.dropped_calls["agent not selected"] == 1
    assert stats.kept_by_agent == {researcher: 1} and stats.dropped_by_agent == {analyst: 1}


def test_calls_under_a_generic_framework_name_are_counted() -> None:
    d = detail(Run("t", [Call([1], [2], agent="model"), Call([3], [4], agent="model"), Call([5], [6], agent="writer")]))
    _, stats = build_episodes([d], AgentSelection.parse("writer"))
    assert stats.generic_names == {"model": 2}  # counted whether the selection keeps them or not
