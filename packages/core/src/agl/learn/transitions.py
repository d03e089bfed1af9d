"""Stored rollouts → ordered transitions, the unit LightningRL optimises.

Each trainable LLM call of a selected agent in a rollout's final attempt becomes one transition
`(prompt_ids, response_ids, reward)`, in the order of the calls (their `seq`). Rewards are placed where they
happened: a reward recorded after call `s` (`after_llm_seq = s`) is credited to the last transition whose call
came at or before `s`; the final reward (the float the agent returned) to the last transition. Nothing is
guessed or filled in: a rollout with no reward at all, a failed rollout, a call without token ids, an unselected or unattributed call, an
over-long transition, a reward that came before the first transition — each is left out and counted in
`BuildStats`, which the trainer shows.

Optional prefix merging: when a call's prompt ids start with the previous transition's prompt + response ids
(a chat that grew by one turn), the two become one transition whose response holds the previous response,
the tokens the environment appended (`response_mask` 0: not trained) and the new response (mask 1).
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from agl.common.gc_pause import gc_paused
from agl.common.packed import FLOAT64, INT32, concat
from agl.common.trainable import CallView, RolloutView
from agl.learn.selection import AgentSelection
from agl.schema import ALL_BYPASSED, Reward, RewardSource, Rollout, RolloutStatus, all_bypassed

# Names frameworks give agents the user did not name, so that calls of different agents collapse into one name
# that no selection can tell apart: LangChain's `create_agent` without `name=` runs its model in a node called
# "model"; a LangGraph graph without a name is "LangGraph". Counted apart so the step line can say "pass name=".
GENERIC_AGENT_NAMES = frozenset({"model", "LangGraph"})
DROPPED_IDS_SHOWN = 5  # rollouts named per reason they were left out for (agl export, the step line)


@dataclass(slots=True)
class Transition:
    rollout_id: str
    task_id: str
    attempt_id: str
    seq: int  # the (first) call's sequence number in its attempt
    agent_name: str | None
    # Token ids as the read gave them: packed int32 arrays from `Store.trainable_rollouts` (no int object per
    # id), lists from a `RolloutDetail`; merged turns are arrays.
    prompt_ids: Sequence[int]
    response_ids: Sequence[int]
    response_mask: list[int]  # 1: produced by the policy (trained); 0: appended by the environment (merged turns)
    logprobs: Sequence[float] | None  # behaviour log-probs of response_ids (0.0 where the mask is 0); None if unknown
    model_version: int | None
    call_ids: list[str]
    reward: float = 0.0  # rewards credited at this step (intermediate ones after it, the final one if last)
    ret: float = 0.0  # the return credit assignment gave it
    advantage: float = 0.0
    weight: float = 1.0  # its weight in the loss (per-rollout weighting makes a rollout's weights sum to 1)
    # the temperature the response was sampled at: the policy's log-probs are those of softmax(logits / temperature)
    temperature: float = 1.0

    @property
    def n_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


@dataclass(slots=True)
class Episode:
    """The transitions of one rollout, in order, with the rewards that were placed on them."""

    rollout_id: str
    task_id: str
    transitions: list[Transition]
    final_reward: float | None  # None: the agent returned none and reported its rewards as it went
    intermediate_rewards: list[float]

    @property
    def total_reward(self) -> float:
        """The undiscounted return: the final reward plus every intermediate reward placed on a transition."""
        return sum(t.reward for t in self.transitions)


@dataclass
class BuildStats:
    rollouts: int = 0
    episodes: int = 0
    transitions: int = 0
    merged_calls: int = 0
    dropped_rollouts: Counter[str] = field(default_factory=Counter)  # reason → rollouts left out
    dropped_calls: Counter[str] = field(default_factory=Counter)  # reason → calls left out
    dropped_rewards: Counter[str] = field(default_factory=Counter)  # reason → rewards not placed
    # transitions without usable behaviour log-probs (the backend sent none, or not one per response token): the
    # trainer recomputes them with the policy and counts them again
    missing_logprobs: Counter[str] = field(default_factory=Counter)
    # calls whose agent name was lost on the way (an HTTP client agl does not patch), trained or not: counted
    # apart because it means the selection cannot work as the user asked
    missed_attribution: int = 0
    # agent name (None: unattributed) → calls kept / left out, of the rollouts that gave an episode or could have:
    # what a selection keeps and drops, shown by `agl export --agents`
    kept_by_agent: Counter[str | None] = field(default_factory=Counter)
    dropped_by_agent: Counter[str | None] = field(default_factory=Counter)
    generic_names: Counter[str] = field(default_factory=Counter)  # calls under a GENERIC_AGENT_NAMES name
    # agent name → calls of the rollouts left out before their calls were looked at (failed, no reward): the names
    # a summary lists among those stored
    in_dropped_rollouts: Counter[str | None] = field(default_factory=Counter)
    # reason → the first DROPPED_IDS_SHOWN rollouts left out for it: what `agl export` names
    dropped_rollout_ids: dict[str, list[str]] = field(default_factory=dict)

    def drop_rollout(self, reason: str, rollout_id: str, calls: Sequence[CallView] = ()) -> None:
        """Count a rollout left out for `reason`, keep its id among the first few, and its calls' agent names."""
        self.dropped_rollouts[reason] += 1
        shown = self.dropped_rollout_ids.setdefault(reason, [])
        if len(shown) < DROPPED_IDS_SHOWN:
            shown.append(rollout_id)
        self.in_dropped_rollouts.update(c.agent_name for c in calls)

    @property
    def stored_agent_names(self) -> list[str | None]:
        """Every agent name among the calls looked at, kept or not, and those of the rollouts left out."""
        names = set(self.kept_by_agent) | set(self.dropped_by_agent) | set(self.in_dropped_rollouts)
        return sorted(names, key=lambda a: (a is None, a or ""))

    def merge(self, other: BuildStats) -> None:
        self.rollouts += other.rollouts
        self.episodes += other.episodes
        self.transitions += other.transitions
        self.merged_calls += other.merged_calls
        self.dropped_rollouts.update(other.dropped_rollouts)
        self.dropped_calls.update(other.dropped_calls)
        self.dropped_rewards.update(other.dropped_rewards)
        self.missed_attribution += other.missed_attribution
        self.missing_logprobs.update(other.missing_logprobs)
        self.kept_by_agent.update(other.kept_by_agent)
        self.dropped_by_agent.update(other.dropped_by_agent)
        self.generic_names.update(other.generic_names)
        self.in_dropped_rollouts.update(other.in_dropped_rollouts)
        for reason, ids in other.dropped_rollout_ids.items():
            shown = self.dropped_rollout_ids.setdefault(reason, [])
            shown.extend(ids[: DROPPED_IDS_SHOWN - len(shown)])

    def summary(self) -> str:
        parts = [f"{self.episodes}/{self.rollouts} rollouts → {self.transitions} transitions"]
        if self.merged_calls:
            parts.append(f"{self.merged_calls} calls merged into the previous turn")
        for title, counter in (
            ("rollouts dropped", self.dropped_rollouts),
            ("calls dropped", self.dropped_calls),
            ("rewards not placed", self.dropped_rewards),
            ("log-probs to recompute", self.missing_logprobs),
        ):
            if counter:
                parts.append(f"{title}: " + ", ".join(f"{k} {v}" for k, v in sorted(counter.items())))
        if self.missed_attribution:
            parts.append(
                f"⚠ {self.missed_attribution} calls lost their agent name (sent by an HTTP client agl does not patch)"
            )
        return "; ".join(parts)


def concat_ids(*parts: Sequence[int]) -> array[int]:
    """One int32 array of these id sequences, end to end."""
    return concat(INT32, *parts)


def _call_reason(call: CallView, selection: AgentSelection) -> str | None:
    """Why a call gives no transition, or None if it does."""
    if not selection.selects(call.agent_name, call.agent_key):
        if call.agent_name is not None:
            return "agent not selected"
        return "agent name lost" if call.attribution.lost else "unattributed"
    if call.status != "ok":
        return "call failed"
    if not call.trainable or not call.prompt_ids or call.response_ids is None:
        return "not trainable: " + (call.not_trainable_reason or "no token ids")
    if not call.response_ids:
        return "empty response"
    return None


def _to_transition(call: CallView, rollout: Rollout, stats: BuildStats) -> Transition:
    # The id sequences are shared with the call, not copied: they are long, and nothing changes them in place
    # (merging builds new ones). Positional arguments: this runs once per call of a step.
    response = call.response_ids or []
    logprobs = call.logprobs
    if logprobs is None:
        stats.missing_logprobs["none from the backend"] += 1
    elif len(logprobs) != len(response):
        stats.missing_logprobs["not one per response token"] += 1
        logprobs = None
    temperature = call.temperature
    return Transition(
        rollout.id,
        rollout.task_id,
        call.attempt_id,
        call.seq,
        call.agent_name,
        call.prompt_ids or [],
        response,
        [1] * len(response),
        logprobs,
        call.model_version,
        [call.id],
        0.0,
        0.0,
        0.0,
        1.0,
        temperature if temperature is not None and temperature > 0 else 1.0,
    )


def _extends(prev: Transition, nxt: Transition) -> bool:
    """`nxt`'s prompt is `prev`'s prompt + response + something: the same chat, one turn later."""
    head = len(prev.prompt_ids) + len(prev.response_ids)
    return (
        prev.agent_name == nxt.agent_name
        and prev.temperature == nxt.temperature  # one transition is scored at one temperature
        and len(nxt.prompt_ids) >= head
        and nxt.prompt_ids[: len(prev.prompt_ids)] == prev.prompt_ids
        and nxt.prompt_ids[len(prev.prompt_ids) : head] == prev.response_ids
    )


def _merge(prev: Transition, nxt: Transition) -> None:
    head = len(prev.prompt_ids) + len(prev.response_ids)
    appended = nxt.prompt_ids[head:]
    prev.response_ids = concat_ids(prev.response_ids, appended, nxt.response_ids)  # new: the calls' stay intact
    prev.response_mask = prev.response_mask + [0] * len(appended) + nxt.response_mask
    if prev.logprobs is not None and nxt.logprobs is not None:
        prev.logprobs = concat(FLOAT64, prev.logprobs, [0.0] * len(appended), nxt.logprobs)
    else:
        prev.logprobs = None
    prev.call_ids = prev.call_ids + nxt.call_ids
    prev.reward += nxt.reward
    if nxt.model_version != prev.model_version:
        prev.model_version = None  # a merged turn spans two policies: no single version produced it


_SEQ = attrgetter("seq")


def build_episode(
    detail: RolloutView,
    selection: AgentSelection = AgentSelection(),
    *,
    merge_prefixes: bool = False,
    max_tokens: int | None = None,
    stats: BuildStats | None = None,
) -> Episode | None:
    """The episode of one stored rollout, or None (with the reason counted in `stats`)."""
    stats = stats if stats is not None else BuildStats()
    stats.rollouts += 1
    rollout = detail.rollout
    if rollout.status is not RolloutStatus.succeeded or rollout.final_attempt_id is None:
        # its calls are not counted: training's read brings none of an unfinished or failed rollout
        stats.drop_rollout(f"rollout {rollout.status.value}", rollout.id)
        return None
    attempt = rollout.final_attempt_id
    final: Reward | None = None  # the last one the agent returned
    intermediate: list[Reward] = []
    for r in detail.rewards:
        if r.attempt_id == attempt:
            if r.source is RewardSource.returned:
                final = r
            else:
                intermediate.append(r)
    final_value = final.value if final is not None else rollout.final_reward
    if final_value is None and not intermediate:
        stats.drop_rollout("no reward", rollout.id, [c for c in detail.llm_calls if c.attempt_id == attempt])
        return None

    transitions: list[Transition] = []
    calls = [c for c in detail.llm_calls if c.attempt_id == attempt]  # a RolloutDetail holds every attempt's
    calls.sort(key=_SEQ)
    kept: list[str | None] = []  # the agent name of each call kept, counted once the loop is done
    for call in calls:
        name = call.agent_name
        if call.attribution.lost:
            stats.missed_attribution += 1
        if name in GENERIC_AGENT_NAMES:
            stats.generic_names[name] += 1
        reason = _call_reason(call, selection)
        if (
            reason is None
            and max_tokens is not None
            and len(call.prompt_ids or []) + len(call.response_ids or []) > max_tokens
        ):
            reason = "longer than max_tokens"
        if reason is not None:
            stats.dropped_calls[reason] += 1
            stats.dropped_by_agent[name] += 1
            continue
        kept.append(name)
        transitions.append(_to_transition(call, rollout, stats))
    stats.kept_by_agent.update(kept)
    if not calls and all_bypassed(rollout, 0):  # nothing reached agl: not a selection that found nothing
        stats.drop_rollout(ALL_BYPASSED, rollout.id)
        return None
    if not transitions:
        stats.drop_rollout("no trainable call of a selected agent", rollout.id)
        return None

    _place_rewards(transitions, intermediate, stats)
    if final_value is not None:
        transitions[-1].reward += final_value
    if merge_prefixes:
        transitions = _merge_prefixes(transitions, max_tokens, stats)
    stats.episodes += 1
    stats.transitions += len(transitions)
    return Episode(rollout.id, rollout.task_id, transitions, final_value, [r.value for r in intermediate])


def _place_rewards(transitions: list[Transition], rewards: Iterable[Reward], stats: BuildStats) -> None:
    seqs = [t.seq for t in transitions]
    for reward in rewards:
        if reward.after_llm_seq is None or reward.after_llm_seq < seqs[0]:
            stats.dropped_rewards["before the first transition"] += 1
            continue
        # the last transition at or before the reward's position
        lo, hi = 0, len(seqs)
        while lo < hi:
            mid = (lo + hi) // 2
            if seqs[mid] <= reward.after_llm_seq:
                lo = mid + 1
            else:
                hi = mid
        transitions[lo - 1].reward += reward.value


def _merge_prefixes(transitions: list[Transition], max_tokens: int | None, stats: BuildStats) -> list[Transition]:
    merged = [transitions[0]]
    for nxt in transitions[1:]:
        prev = merged[-1]
        if _extends(prev, nxt) and (max_tokens is None or nxt.n_tokens <= max_tokens):
            _merge(prev, nxt)
            stats.merged_calls += 1
        else:
            merged.append(nxt)
    return merged


def build_episodes(
    details: Iterable[RolloutView],
    selection: AgentSelection = AgentSelection(),
    *,
    merge_prefixes: bool = False,
    max_tokens: int | None = None,
) -> tuple[list[Episode], BuildStats]:
    stats = BuildStats()
    with gc_paused():  # thousands of transitions and lists, no cycles among them (agl.common.gc_pause)
        episodes = [
            ep
            for d in details
            if (ep := build_episode(d, selection, merge_prefixes=merge_prefixes, max_tokens=max_tokens, stats=stats))
        ]
    return episodes, stats
