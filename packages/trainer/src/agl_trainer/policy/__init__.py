"""The policy and its update: what agl's own trainer does to the model between rollouts.

- `trainer`: `PolicyTrainer`, log-probs of transitions and the clipped policy-gradient update, LoRA or full weights;
- `packing`: sequences packed around the beginning they share (the engine packs its batches the same way);
- `off_policy`: the importance weights of the off-policy correction (verl's update takes the same);
- `memory`: the trainer process's own memory, given back after an update.

verl's update (`agl_trainer.verl`) sits beside this one. The policy imports only the run's config, the model's shape
and the interfaces (`agl_trainer.backends`): never an engine, the plan or the run.

`from agl_trainer.policy import PolicyTrainer` (the module this folder was before the trainer was laid out by its
parts) still works for one release, with a deprecation warning: import from `agl_trainer.policy.trainer`.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    trainer = importlib.import_module("agl_trainer.policy.trainer")
    if not hasattr(trainer, name):
        raise AttributeError(f"module 'agl_trainer.policy' has no attribute {name!r}")
    warnings.warn(
        f"agl_trainer.policy.{name} is deprecated: import it from agl_trainer.policy.trainer (agl-trainer's layout by "
        "its parts moved it; this alias is removed one release after the move)",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(trainer, name)
