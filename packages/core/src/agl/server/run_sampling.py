"""The run's sampling in place of a trained agent's (`agl serve --own-sampling-for AGENTS`; `agl train` sets it).

In RL the trainer owns the sampling: it trains softmax(logits / T) at the temperature each response was drawn
with, and a call sent greedily (`temperature: 0`, as Aider and BeeAI send) or truncated (top-p, penalties) is no
sample of that policy, so it was stored not trainable and the rollout trained nothing. For the agents the run owns,
a training call goes to the engine at the run's temperature with the truncating parameters removed; the stored
request keeps what the agent asked, and the server warns once per agent that it overrode it."""

from __future__ import annotations

import logging
from typing import Any

from agl.server.call_record import NEUTRAL_SAMPLING, CallRecord
from agl.server.upstream_config import UpstreamConfig

log = logging.getLogger(__name__)


class RunSampling:
    def __init__(self, upstream: UpstreamConfig) -> None:
        self.agents = upstream.own_sampling
        self.temperature = upstream.temperature
        self._warned: set[str | None] = set()

    def apply(self, payload: dict[str, Any], rec: CallRecord) -> float | None:
        """For a training call of an agent the run owns: `payload` stripped of what truncates the distribution,
        `rec` marked, and the temperature to send; None for any other call (left as it is)."""
        if self.agents is None or self.temperature is None or not self.agents.selects(rec.agent, rec.agent_key):
            return None
        asked = {key: payload.pop(key) for key in NEUTRAL_SAMPLING if key in payload}
        changed = {key: value for key, value in asked.items() if value not in NEUTRAL_SAMPLING[key]}
        temperature = payload.get("temperature")
        number = temperature if isinstance(temperature, (int, float)) and not isinstance(temperature, bool) else None
        if number is not None and float(number) != self.temperature:
            changed["temperature"] = number
        rec.sampling_owned = True
        if changed and rec.agent not in self._warned:
            self._warned.add(rec.agent)
            shown = ", ".join(f"{key}={value!r}" for key, value in sorted(changed.items()))
            log.warning(
                "agent %s asked for %s; its training calls are sampled at temperature %g instead, as the run says "
                "(the trainer owns the sampling: agl serve --own-sampling-for; agl train --keep-agent-sampling "
                "sends the agent's own)",
                repr(rec.agent) if rec.agent is not None else "(unnamed)",
                shown,
                self.temperature,
            )
        return self.temperature
