"""LightningRL credit assignment: the return and advantage of every transition, from the episode's rewards.

Notation. Episode i is a rollout of task τ(i); its transitions t = 0 … n_i − 1 carry the rewards r_{i,t} that
`agl.learn.transitions` placed on them (intermediate rewards where they happened, the final reward on the last).

    R_i     = Σ_t r_{i,t}                              the episode's return
    G_{i,t} = Σ_{k ≥ t} γ^(k−t) r_{i,k}                 the discounted return from step t on

Each strategy sets `ret`, `advantage` and `weight` on every transition; the policy loss is then
Σ weight · clipped-ratio · advantage (per-token mean inside a transition), a single-turn RL method applied to
each transition, as in the paper.

    broadcast   A_{i,t} = R_i                                w_{i,t} = 1
                The paper's choice: every call of a run gets the run's return, identically.
    discounted  A_{i,t} = G_{i,t}                            w_{i,t} = 1
                Uses intermediate rewards: a step is credited with what came after it, not before.
    grpo        A_{i,t} = (R_i − μ_τ) / (σ_τ + ε)            w_{i,t} = 1 / n_i
                μ_τ, σ_τ: mean and population standard deviation of R_j over the rollouts j of task τ.
                Per-rollout weights make each rollout weigh 1 in the loss however many calls it made, so
                long rollouts do not dominate the group; Σ_{i,t} w_{i,t} A_{i,t} = 0 within each task.
    step        A_{i,t} = (G_{i,t} − μ_g) / (σ_g + ε)        w_{i,t} = 1 / n_i
                g: the transitions of task τ whose prompt ids are identical (one state reached by several
                rollouts), compared with each other: μ_g, σ_g over g. A transition whose prompt no other
                transition shares falls back to its rollout's grpo advantage.

`scale_by_std=False` drops the division by σ (as in Dr. GRPO). A task with one rollout, or whose rollouts all
earned the same return, gives advantage 0: counted in `CreditStats`, since such a group teaches nothing. "The
same" allows for rounding (σ ≤ `zero_std_tol`): returns 0.1 + 0.2 and 0.3 are equal rewards, and dividing their
difference of 5.6e-17 by σ + ε would hand both a tiny advantage that dilutes the step.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agl.learn.transitions import Episode, Transition


@dataclass
class CreditConfig:
    gamma: float = 1.0
    eps: float = 1e-6
    scale_by_std: bool = True
    zero_std_tol: float = 1e-9  # a group whose returns spread less than this earned the same: advantage 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        if self.eps <= 0:
            raise ValueError(f"eps must be > 0, got {self.eps}")
        if self.zero_std_tol < 0:
            raise ValueError(f"zero_std_tol must be ≥ 0, got {self.zero_std_tol}")


@dataclass
class CreditStats:
    strategy: str
    episodes: int = 0
    transitions: int = 0
    groups: int = 0  # tasks (grpo) or tasks + shared-prompt groups (step)
    single_rollout_groups: int = 0  # a task with one rollout: no comparison, advantage 0
    zero_variance_groups: int = 0  # all rollouts of a task earned the same: advantage 0
    shared_prompt_transitions: int = 0  # step: transitions compared with others from the same state


CreditFn = Callable[[Sequence[Episode], CreditConfig, CreditStats], None]
STRATEGIES: dict[str, CreditFn] = {}


def register(name: str) -> Callable[[CreditFn], CreditFn]:
    def add(fn: CreditFn) -> CreditFn:
        STRATEGIES[name] = fn
        return fn

    return add


def assign_credit(
    episodes: Sequence[Episode], strategy: str = "grpo", config: CreditConfig | None = None
) -> CreditStats:
    """Set `ret`, `advantage` and `weight` on every transition of `episodes` (in place)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown credit strategy {strategy!r}; choose one of {', '.join(sorted(STRATEGIES))}")
    stats = CreditStats(strategy, episodes=len(episodes), transitions=sum(len(e.transitions) for e in episodes))
    STRATEGIES[strategy](episodes, config or CreditConfig(), stats)
    return stats


def returns_to_go(rewards: Sequence[float], gamma: float) -> list[float]:
    """G_t = r_t + γ G_{t+1}, from the last step back."""
    out = [0.0] * len(rewards)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / n
    return mean, var**0.5


def _normalise(value: float, mean: float, std: float, config: CreditConfig) -> float:
    centred = value - mean
    return centred / (std + config.eps) if config.scale_by_std else centred


def _set_discounted_returns(episodes: Sequence[Episode], gamma: float) -> None:
    for ep in episodes:
        for t, g in zip(ep.transitions, returns_to_go([t.reward for t in ep.transitions], gamma), strict=True):
            t.ret = g


@register("broadcast")
def broadcast(episodes: Sequence[Episode], config: CreditConfig, stats: CreditStats) -> None:
    for ep in episodes:
        total = ep.total_reward
        for t in ep.transitions:
            t.ret = t.advantage = total
            t.weight = 1.0


@register("discounted")
def discounted(episodes: Sequence[Episode], config: CreditConfig, stats: CreditStats) -> None:
    _set_discounted_returns(episodes, config.gamma)
    for ep in episodes:
        for t in ep.transitions:
            t.advantage = t.ret
            t.weight = 1.0


def _rollout_advantages(episodes: Sequence[Episode], config: CreditConfig, stats: CreditStats) -> list[float]:
    """The grpo advantage of each episode: its return against the other rollouts of its task."""
    by_task: dict[str, list[int]] = defaultdict(list)
    for i, ep in enumerate(episodes):
        by_task[ep.task_id].append(i)
    totals = [ep.total_reward for ep in episodes]
    advantages = [0.0] * len(episodes)
    for members in by_task.values():
        stats.groups += 1
        if len(members) < 2:
            stats.single_rollout_groups += 1
            continue
        mean, std = _mean_std([totals[i] for i in members])
        if std <= config.zero_std_tol:
            stats.zero_variance_groups += 1
            continue
        for i in members:
            advantages[i] = _normalise(totals[i], mean, std, config)
    return advantages


def _weigh_per_rollout(ep: Episode) -> None:
    weight = 1.0 / len(ep.transitions)
    for t in ep.transitions:
        t.weight = weight


@register("grpo")
def grpo(episodes: Sequence[Episode], config: CreditConfig, stats: CreditStats) -> None:
    for ep, advantage in zip(episodes, _rollout_advantages(episodes, config, stats), strict=True):
        _weigh_per_rollout(ep)
        total = ep.total_reward
        for t in ep.transitions:
            t.ret = total
            t.advantage = advantage


def _same_prompt_groups(episodes: Sequence[Episode]) -> list[list[Transition]]:
    """Transitions of the same task with identical prompt ids, reached by at least two rollouts (a prompt that
    repeats inside one rollout only compares that rollout with itself). A cheap key (the length and the middle id)
    buckets them first, so only likely matches have their whole prompts compared: hashing every prompt in full
    touched each of its int objects and cost more than the rest of credit assignment. Not the ends: prompts
    begin with the same system turn and end with the same generation prompt, so their end ids tell nothing. The
    key is one int, not a tuple: a tuple per transition was an object for the cycle collector to walk."""
    # per task: the first transition of each key, and the keys met more than once (most are met once: a
    # list for each would be another object per transition)
    by_task: dict[str, tuple[dict[int, Transition], dict[int, list[Transition]]]] = {}
    for ep in episodes:
        found = by_task.get(ep.task_id)
        if found is None:
            found = by_task[ep.task_id] = ({}, {})
        first, repeated = found
        for t in ep.transitions:
            ids = t.prompt_ids
            n = len(ids)
            key = (n << 32) ^ ids[n // 2] if n else 0  # a collision only costs a comparison of whole prompts
            if key not in first:
                first[key] = t
            elif (bucket := repeated.get(key)) is None:
                repeated[key] = [first[key], t]
            else:
                bucket.append(t)
    groups: list[list[Transition]] = []
    for _, repeated in by_task.values():
        for bucket in repeated.values():
            exact: list[list[Transition]] = []
            for t in bucket:
                for group in exact:
                    if group[0].prompt_ids == t.prompt_ids:
                        group.append(t)
                        break
                else:
                    exact.append([t])
            groups += [g for g in exact if len({t.rollout_id for t in g}) > 1]
    return groups


@register("step")
def step(episodes: Sequence[Episode], config: CreditConfig, stats: CreditStats) -> None:
    fallback = _rollout_advantages(episodes, config, stats)
    _set_discounted_returns(episodes, config.gamma)
    for ep, advantage in zip(episodes, fallback, strict=True):
        _weigh_per_rollout(ep)
        for t in ep.transitions:
            t.advantage = advantage
    for members in _same_prompt_groups(episodes):
        stats.groups += 1
        stats.shared_prompt_transitions += len(members)
        mean, std = _mean_std([t.ret for t in members])
        same = std <= config.zero_std_tol
        for t in members:
            t.advantage = 0.0 if same else _normalise(t.ret, mean, std, config)
        if same:
            stats.zero_variance_groups += 1
