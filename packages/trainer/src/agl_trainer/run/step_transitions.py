"""A train step's rollouts → transitions: the episodes of the selected agents, credit assigned over whole groups,
then the calls too stale to train on left out (agl_trainer.run.staleness). Each transition is also written to the run
directory, with what credit assignment gave it."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from agl.common.trainable import TrainableRollout
from agl.learn.credit import CreditConfig, CreditStats, assign_credit
from agl.learn.selection import AgentSelection
from agl.learn.transitions import BuildStats, Episode, Transition, build_episodes
from agl_trainer.config import TrainConfig
from agl_trainer.run.staleness import Freshness, keep_fresh, stale_reason


@dataclass
class StepTransitions:
    episodes: list[Episode]
    build: BuildStats
    credit: CreditStats
    fresh: Freshness
    dropped_calls: dict[str, int]  # the build's, and the calls too stale to train on

    @property
    def transitions(self) -> list[Transition]:
        return self.fresh.kept


def check_calls_recorded(trainable: Sequence[TrainableRollout], llm_use: Mapping[str, int], step: int) -> None:
    """Refuse a step whose every rollout sent its LLM calls elsewhere than agl: nothing could be trained on."""
    if trainable and llm_use["rollouts_only_bypassing"] == len(trainable):
        raise ValueError(
            f"every rollout of step {step + 1} sent its LLM calls elsewhere than agl and none was recorded "
            f"(e.g. {trainable[0].rollout.bypassed_llm_calls} call(s) of rollout {trainable[0].rollout.id}; "
            "`agl show` names where they went): point the agent's client at the run's LLM URL (agl's workers "
            "set OPENAI_BASE_URL to it) or at the `llm.base_url` its rollout function is given"
        )


def check_selection_found(build: BuildStats, selection: AgentSelection, step: int) -> None:
    """Refuse a step that selects agents and found none of their calls among calls it had: the agent names are not
    what the app's calls carry (a typo, or a framework whose agents reach agl unnamed), and every later step
    would train nothing too."""
    if selection.agents is None or build.kept_by_agent.total() > 0 or not build.dropped_by_agent:
        return
    if any(name is not None and selection.selects(name) for name in build.dropped_by_agent):
        return  # the agents called, and their calls were left out for other reasons (the step line says which)
    seen = ", ".join(
        f"{name if name is not None else 'unattributed'} ({count})"
        for name, count in build.dropped_by_agent.most_common()
    )
    raise ValueError(
        f"step {step + 1} trained nothing: it selects the agents {selection}, and none of its LLM calls was under"
        f" them; its calls were under: {seen}. Give --agents the names the app's calls carry (`agl show` lists a"
        " rollout's calls and their agents); calls stored unattributed name no agent at all: name the agent in the"
        ' app (`with agl.agent("name"):`) or see the framework\'s guide'
    )


def step_transitions(
    trainable: Sequence[TrainableRollout],
    selection: AgentSelection,
    config: TrainConfig,
    version_steps: Mapping[int, int],
    *,
    updating: int,
    max_staleness: int,
) -> StepTransitions:
    """The transitions step `updating` trains on (`version_steps`: each published version → its step)."""
    episodes, build = build_episodes(
        trainable,
        selection,
        merge_prefixes=config.merge_prefixes,
        max_tokens=config.max_transition_tokens,
    )
    credit = assign_credit(episodes, config.strategy, CreditConfig(gamma=config.gamma))
    # credit is assigned over whole groups first: a call dropped as too stale takes its gradient out, not its
    # rollout's reward out of the group's baseline
    fresh = keep_fresh(
        [t for ep in episodes for t in ep.transitions],
        {c.id: c.model_version for r in trainable for c in r.llm_calls},
        version_steps,
        updating=updating,
        max_staleness=max_staleness,
    )
    dropped_calls = dict(build.dropped_calls)
    if fresh.dropped:
        dropped_calls[stale_reason(max_staleness)] = fresh.dropped
    return StepTransitions(episodes, build, credit, fresh, dropped_calls)


def write_transitions(run_dir: Path, step: int, transitions: Sequence[Transition]) -> None:
    """What credit assignment gave each transition of the step, for inspection (and tests)."""
    folder = run_dir / "transitions"
    folder.mkdir(exist_ok=True)
    with (folder / f"step-{step}.jsonl").open("w") as f:
        for t in transitions:
            f.write(
                json.dumps(
                    {
                        "rollout_id": t.rollout_id,
                        "task_id": t.task_id,
                        "seq": t.seq,
                        "agent": t.agent_name,
                        "reward": t.reward,
                        "return": t.ret,
                        "advantage": t.advantage,
                        "weight": t.weight,
                        "prompt_tokens": len(t.prompt_ids),
                        "response_tokens": len(t.response_ids),
                    }
                )
                + "\n"
            )
