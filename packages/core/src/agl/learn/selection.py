"""Agent selection: which agents' LLM calls become training data.

One flag picks them: `AGL_TRAIN_AGENTS=writer,rewriter` in the environment, the same key (`train_agents`) in a
run config, or a keyword argument. An entry with `*`, `?` or `[...]` is a shell-style pattern matched against the
whole name, case-sensitively (`"*Researcher"` selects CrewAI's `{topic} Senior Data Researcher` whatever the
topic); any other entry is an exact name. An agent may also have a stable second name (its key: for CrewAI, the
role before `{topic}` is filled in, so `"{topic} Senior Data Researcher"` selects it too); entries match either. Unselected agents still run and are still traced; their calls only give no
transitions. With no selection every attributed and unattributed call is trained; with one, a call that no
agent scope named cannot be said to belong to a selected agent, so it is left out (and counted).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from functools import cached_property

ENV_VAR = "AGL_TRAIN_AGENTS"
_NAME = re.compile(r"^[^\s,][^,]*$")
_PATTERN = re.compile(r"[*?\[]")


def is_pattern(entry: str) -> bool:
    """Whether a selection entry is a glob pattern rather than an exact agent name."""
    return _PATTERN.search(entry) is not None


@dataclass(frozen=True)
class AgentSelection:
    """`agents=None`: every call is trained. Otherwise only calls attributed to an agent that one of `agents`
    names (exactly, or as a glob pattern)."""

    agents: frozenset[str] | None = None

    @classmethod
    def parse(cls, value: str | Iterable[str] | None) -> AgentSelection:
        """`"writer,rewriter"`, `"*Researcher,writer"`, a list of entries, or None / "" / "*" for all agents."""
        if value is None:
            return cls(None)
        names = value.split(",") if isinstance(value, str) else list(value)
        cleaned = [n.strip() for n in names if n.strip()]
        if not cleaned or cleaned == ["*"]:
            return cls(None)
        for name in cleaned:
            if not _NAME.match(name) or name == "*":
                raise ValueError(
                    f"agent name {name!r} in the training selection is not valid"
                    + (" ('*' alone selects all agents: give it alone)" if name == "*" else "")
                )
        return cls(frozenset(cleaned))

    @classmethod
    def resolve(
        cls, explicit: str | Iterable[str] | None = None, config_value: str | Iterable[str] | None = None
    ) -> AgentSelection:
        """The keyword argument wins, then the run config's `train_agents`, then `AGL_TRAIN_AGENTS`."""
        for value in (explicit, config_value, os.environ.get(ENV_VAR)):
            if value is not None:
                return cls.parse(value)
        return cls(None)

    @cached_property
    def names(self) -> frozenset[str]:
        """The exact names among the entries (patterns left out)."""
        return frozenset(a for a in self.agents or () if not is_pattern(a))

    @cached_property  # selects() runs once per stored call: match against a precomputed tuple
    def patterns(self) -> tuple[str, ...]:
        return tuple(sorted(a for a in self.agents or () if is_pattern(a)))

    def selects(self, agent_name: str | None, agent_key: str | None = None) -> bool:
        """Whether a call of this agent is trained; `agent_key`, the agent's stable second name where it has one
        (see `agl.agent`), is matched as well as its name."""
        if self.agents is None:
            return True
        return any(
            name is not None and (name in self.agents or any(fnmatchcase(name, p) for p in self.patterns))
            for name in (agent_name, agent_key)
        )

    def __str__(self) -> str:
        return "all agents" if self.agents is None else ",".join(sorted(self.agents))
