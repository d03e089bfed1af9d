"""AIR: tool outcomes and unreadable answers become automatic rewards, placed after the right call, once."""

from __future__ import annotations

from factories import Call, Run, ToolSpan, detail

from agl.learn.air import AnswerParseRule, ToolStatusRule, air_rewards, with_air, with_rewards_added
from agl.learn.transitions import build_episode
from agl.schema import RewardSource, SpanStatus


def test_tool_errors_are_penalised_after_the_call_that_asked_for_the_tool() -> None:
    d = detail(
        Run(
            "t",
            [Call([1], [2]), Call([3], [4]), Call([5], [6])],
            tools=[
                ToolSpan("calc", SpanStatus.error, after_seq=0),
                ToolSpan("calc", SpanStatus.ok, after_seq=1),
                ToolSpan("search", SpanStatus.error, after_seq=None, start_time=1.7),  # placed by time: after call 1
            ],
        )
    )
    rewards = air_rewards(d)
    assert [(r.value, r.after_llm_seq, r.metadata["tool"]) for r in rewards] == [(-0.1, 0, "calc"), (-0.1, 1, "search")]
    assert all(r.source is RewardSource.automatic and r.name == "air:tool_status" for r in rewards)
    rewarded_ok = air_rewards(d, [ToolStatusRule(error_reward=-1.0, ok_reward=0.2)])
    assert [r.value for r in rewarded_ok] == [-1.0, 0.2, -1.0]
    only_search = air_rewards(d, [ToolStatusRule(tool="search", name="air:search_error")])
    assert [(r.name, r.metadata["tool"], r.after_llm_seq) for r in only_search] == [("air:search_error", "search", 1)]


def test_air_rewards_reach_the_transitions_and_count_once() -> None:
    d = detail(Run("t", [Call([1], [2]), Call([3], [4])], tools=[ToolSpan("calc", SpanStatus.error, after_seq=0)]))
    enriched = with_air(d)
    assert with_air(enriched) is enriched  # already there (same uid): nothing added twice
    ep = build_episode(enriched)
    assert ep is not None and [t.reward for t in ep.transitions] == [-0.1, 1.0]


def test_rewards_computed_once_are_added_as_with_air_adds_them() -> None:
    """The trainer runs the rules once per rollout, stores their rewards and adds the same list to the rollout."""
    d = detail(Run("t", [Call([1], [2]), Call([3], [4])], tools=[ToolSpan("calc", SpanStatus.error, after_seq=0)]))
    new = air_rewards(d)
    added = with_rewards_added(d, new)
    assert added.rewards == with_air(d).rewards and len(added.rewards) == len(d.rewards) + 1
    assert [r.id for r in added.rewards] == sorted({r.id for r in added.rewards})  # numbered after the stored ones
    assert with_rewards_added(d, []) is d


def test_unparsable_answer_rule() -> None:
    def number(text: str) -> float:
        return float(text.split()[-1])

    d = detail(Run("t", [Call([1], [2])]))
    d.llm_calls[0].response_message = {"role": "assistant", "content": "I think it is forty"}
    (r,) = air_rewards(d, [AnswerParseRule(number)])
    assert r.value == -0.5 and r.after_llm_seq == 0 and r.name == "air:unparsable_answer"
    d.llm_calls[0].response_message = {"role": "assistant", "content": "It is 40"}
    assert air_rewards(d, [AnswerParseRule(number)]) == []
    assert air_rewards(d, [AnswerParseRule(number, agent="someone else")]) == []


def test_a_harness_s_tool_run_is_placed_after_the_call_that_asked_by_its_id_or_order() -> None:
    # the runs were recorded after the harness ended: times and recorded seqs both point past the last call
    late = {"after_seq": 3, "start_time": 9.0}
    calls = [
        Call([1], [2], agent="codex", tool_calls=(("c0", "exec_command"),)),
        Call([3], [4], agent="codex", tool_calls=(("c1", "update_plan"), ("c2", "apply_patch"))),
        Call([5], [6], agent="other", tool_calls=(("c3", "exec_command"),)),  # another agent's call: not counted
        Call([7], [8], agent="codex", tool_calls=(("c4", "exec_command"),)),
    ]
    ordinal_of = ["exec_command", "apply_patch", "shell"]
    tools = [
        ToolSpan("Bash", SpanStatus.error, **late, attributes={"gen_ai.tool.call.id": "c2"}),  # by id
        ToolSpan(
            "command_execution",
            SpanStatus.error,
            **late,
            agent="codex",  # the 2nd listed call: apply_patch
            attributes={"agl.tool.call_ordinal": 1, "agl.tool.call_ordinal_of": ordinal_of},
        ),
        ToolSpan(
            "command_execution",
            SpanStatus.error,
            **late,
            agent="codex",  # the 3rd: seq 3, skipping `other`
            attributes={"agl.tool.call_ordinal": 2, "agl.tool.call_ordinal_of": ordinal_of},
        ),
        ToolSpan(
            "Bash",
            SpanStatus.error,
            after_seq=None,
            start_time=2.7,  # an id no call answered: by time
            attributes={"gen_ai.tool.call.id": "gone"},
        ),
        ToolSpan(
            "command_execution",
            SpanStatus.error,
            **late,
            agent="codex",  # past the calls: the recorded seq
            attributes={"agl.tool.call_ordinal": 9, "agl.tool.call_ordinal_of": ordinal_of},
        ),
    ]
    rewards = air_rewards(detail(Run("t", calls, tools=tools)))
    assert [r.after_llm_seq for r in rewards] == [1, 1, 3, 2, 3]
