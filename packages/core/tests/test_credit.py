"""Credit assignment: each strategy against hand-computed values, and invariants as properties."""

from __future__ import annotations

import math

import pytest
from factories import Call, Rew, Run, detail
from hypothesis import given, settings
from hypothesis import strategies as st

from agl.learn.credit import STRATEGIES, CreditConfig, assign_credit, returns_to_go
from agl.learn.transitions import Episode, build_episodes


def episodes_of(*runs: Run) -> list[Episode]:
    episodes, _ = build_episodes([detail(r) for r in runs])
    return episodes


def test_broadcast_gives_every_call_the_episode_return() -> None:
    (ep,) = episodes_of(Run("t", [Call([1], [2]), Call([3], [4])], rewards=[Rew(0.1, 0)], final=1.0))
    assign_credit([ep], "broadcast")
    assert [t.advantage for t in ep.transitions] == pytest.approx([1.1, 1.1])
    assert [t.weight for t in ep.transitions] == [1.0, 1.0]


def test_discounted_returns_credit_only_what_came_after() -> None:
    (ep,) = episodes_of(
        Run("t", [Call([1], [2]), Call([3], [4]), Call([5], [6])], rewards=[Rew(0.1, 0), Rew(-0.2, 1)], final=1.0)
    )
    assign_credit([ep], "discounted", CreditConfig(gamma=0.5))
    # rewards per step: 0.1, -0.2, 1.0 → G2 = 1.0; G1 = -0.2 + 0.5 = 0.3; G0 = 0.1 + 0.15 = 0.25
    assert [t.advantage for t in ep.transitions] == pytest.approx([0.25, 0.3, 1.0])
    assert returns_to_go([0.1, -0.2, 1.0], 1.0) == pytest.approx([0.9, 0.8, 1.0])


def test_grpo_compares_rollouts_of_a_task_and_weighs_each_rollout_once() -> None:
    eps = episodes_of(
        Run("t", [Call([1], [2]), Call([3], [4])], final=1.0),
        Run("t", [Call([1], [2])], final=0.0),
        Run("t", [Call([1], [2]), Call([3], [4]), Call([5], [6])], final=0.0),
        Run("lonely", [Call([1], [2])], final=1.0),
    )
    stats = assign_credit(eps, "grpo")
    # returns 1, 0, 0: mean 1/3, population std sqrt(2)/3 → advantages sqrt(2) and -1/sqrt(2)
    assert [t.advantage for t in eps[0].transitions] == pytest.approx([math.sqrt(2)] * 2, rel=1e-5)
    assert eps[1].transitions[0].advantage == pytest.approx(-1 / math.sqrt(2), rel=1e-5)
    assert [t.advantage for t in eps[2].transitions] == pytest.approx([-1 / math.sqrt(2)] * 3, rel=1e-5)
    assert [t.weight for t in eps[0].transitions] == [0.5, 0.5]
    assert [t.weight for t in eps[2].transitions] == pytest.approx([1 / 3] * 3)
    assert eps[3].transitions[0].advantage == 0.0
    assert (stats.groups, stats.single_rollout_groups, stats.zero_variance_groups) == (2, 1, 0)


def test_grpo_without_std_scaling_and_with_equal_returns() -> None:
    eps = episodes_of(Run("t", [Call([1], [2])], final=1.0), Run("t", [Call([1], [2])], final=0.0))
    assign_credit(eps, "grpo", CreditConfig(scale_by_std=False))
    assert [e.transitions[0].advantage for e in eps] == [0.5, -0.5]
    same = episodes_of(Run("u", [Call([1], [2])], final=1.0), Run("u", [Call([1], [2])], final=1.0))
    stats = assign_credit(same, "grpo")
    assert [e.transitions[0].advantage for e in same] == [0.0, 0.0] and stats.zero_variance_groups == 1


def test_step_groups_compare_transitions_that_saw_the_same_prompt() -> None:
    eps = episodes_of(
        Run("t", [Call([1, 2, 3], [4]), Call([10], [11])], final=1.0),
        Run("t", [Call([1, 2, 3], [5]), Call([20], [21])], final=0.0),
        Run("t", [Call([1, 2, 3], [6]), Call([30], [31])], rewards=[Rew(0.5, 0)], final=0.0),
    )
    stats = assign_credit(eps, "step")
    # first calls share the prompt [1,2,3]: returns-to-go 1, 0, 0.5 → mean 0.5, std sqrt(1/6)
    std = math.sqrt(1 / 6)
    assert [e.transitions[0].advantage for e in eps] == pytest.approx([0.5 / std, -0.5 / std, 0.0], abs=1e-5)
    # second calls saw different prompts: they keep their rollout's grpo advantage (returns 1, 0, 0.5)
    assert [e.transitions[1].advantage for e in eps] == pytest.approx([0.5 / std, -0.5 / std, 0.0], abs=1e-5)
    assert [e.transitions[0].ret for e in eps] == [1.0, 0.0, 0.5]
    assert stats.shared_prompt_transitions == 3


def test_returns_equal_up_to_rounding_are_a_zero_variance_group() -> None:
    """0.1 + 0.2 and 0.3 differ by 5.6e-17: compared by `==`, their std passed as nonzero and both rollouts got
    an advantage of about ∓5.6e-11, which slipped past the trainer's `advantage != 0` filter."""
    for strategy in ("grpo", "step"):
        eps = episodes_of(
            Run("t", [Call([1, 2], [3])], rewards=[Rew(0.1, 0)], final=0.2),
            Run("t", [Call([1, 2], [4])], final=0.3),
        )
        assert eps[0].total_reward != eps[1].total_reward  # the premise: they are not equal as floats
        stats = assign_credit(eps, strategy)
        assert [e.transitions[0].advantage for e in eps] == [0.0, 0.0], strategy
        assert stats.zero_variance_groups >= 1, strategy


def test_step_a_prompt_repeated_inside_one_rollout_keeps_its_rollouts_advantage() -> None:
    """A prompt seen twice by one rollout is not a state several rollouts reached: comparing the rollout with
    itself gave 0; it keeps the rollout's grpo advantage (returns 1 and 0 → +1 and −1)."""
    eps = episodes_of(
        Run("t", [Call([7, 7, 7], [1]), Call([7, 7, 7], [2])], final=1.0),
        Run("t", [Call([8, 8], [3])], final=0.0),
    )
    stats = assign_credit(eps, "step")
    assert [t.advantage for t in eps[0].transitions] == pytest.approx([1.0, 1.0], abs=1e-5)
    assert eps[1].transitions[0].advantage == pytest.approx(-1.0, abs=1e-5)
    assert stats.shared_prompt_transitions == 0 and stats.zero_variance_groups == 0


def test_unknown_strategy_and_bad_config_are_refused() -> None:
    with pytest.raises(ValueError, match=r"unknown credit strategy 'ppo'.*broadcast"):
        assign_credit([], "ppo")
    with pytest.raises(ValueError, match="gamma"):
        CreditConfig(gamma=1.5)


# ------------------------------------------------------------------------------------------ properties

rewards = st.floats(min_value=-5, max_value=5, allow_nan=False)
run_shapes = st.lists(
    st.tuples(
        st.sampled_from(["t1", "t2", "t3"]),  # task
        st.lists(st.tuples(st.integers(0, 3), rewards), min_size=1, max_size=5),  # (prompt id, reward) per call
        rewards,  # final reward
    ),
    min_size=1,
    max_size=12,
)


def make_runs(shapes: list[tuple[str, list[tuple[int, float]], float]]) -> list[Episode]:
    runs = []
    for task, calls, final in shapes:
        runs.append(
            Run(
                task,
                [Call([p, 100 + i], [7]) for i, (p, _) in enumerate(calls)],
                rewards=[Rew(r, i) for i, (_, r) in enumerate(calls)],
                final=final,
            )
        )
    return episodes_of(*runs)


@settings(max_examples=150, deadline=None)
@given(run_shapes)
def test_grpo_advantages_have_zero_weighted_mean_per_task_and_rollouts_weigh_one(shapes: list) -> None:
    eps = make_runs(shapes)
    assign_credit(eps, "grpo")
    for task in {e.task_id for e in eps}:
        mine = [e for e in eps if e.task_id == task]
        assert abs(sum(t.weight * t.advantage for e in mine for t in e.transitions)) < 1e-6 * max(1, len(mine))
    for e in eps:
        assert sum(t.weight for t in e.transitions) == pytest.approx(1.0)
        assert len({t.advantage for t in e.transitions}) == 1


@settings(max_examples=150, deadline=None)
@given(run_shapes)
def test_step_groups_have_zero_mean(shapes: list) -> None:
    eps = make_runs(shapes)
    assign_credit(eps, "step")
    groups: dict[tuple[str, tuple[int, ...]], list[tuple[str, float]]] = {}
    for e in eps:
        for t in e.transitions:
            groups.setdefault((e.task_id, tuple(t.prompt_ids)), []).append((e.rollout_id, t.advantage))
    for members in groups.values():
        if len({rollout for rollout, _ in members}) > 1:  # a state reached by several rollouts
            assert abs(sum(a for _, a in members)) < 1e-6 * len(members)


@settings(max_examples=100, deadline=None)
@given(run_shapes)
def test_discounted_with_gamma_one_starts_at_the_episode_return(shapes: list) -> None:
    eps = make_runs(shapes)
    assign_credit(eps, "discounted", CreditConfig(gamma=1.0))
    for e in eps:
        assert e.transitions[0].advantage == pytest.approx(e.total_reward, abs=1e-9)
        assert e.transitions[-1].advantage == pytest.approx(e.transitions[-1].reward, abs=1e-9)


def test_every_registered_strategy_is_documented_in_the_module() -> None:
    import agl.learn.credit

    for name in STRATEGIES:
        assert f"\n    {name} " in (agl.learn.credit.__doc__ or ""), name


def test_step_groups_need_identical_prompts_not_just_the_same_length_and_ends() -> None:
    eps = episodes_of(
        Run("t", [Call([1, 2, 3, 4, 5, 6, 7, 8, 9], [4])], final=1.0),
        Run("t", [Call([1, 2, 3, 4, 0, 6, 7, 8, 9], [5])], final=0.0),  # differs in the middle only
        Run("t", [Call([1, 2, 3, 4, 5, 6, 7, 8, 9], [6])], final=0.0),
    )
    stats = assign_credit(eps, "step")
    assert stats.shared_prompt_transitions == 2  # rollouts 0 and 2 are compared; 1 keeps its grpo advantage
    assert eps[0].transitions[0].advantage == pytest.approx(1.0, abs=1e-5)
    assert eps[2].transitions[0].advantage == pytest.approx(-1.0, abs=1e-5)
    assert eps[1].transitions[0].advantage == pytest.approx(-1 / math.sqrt(2), rel=1e-5)
