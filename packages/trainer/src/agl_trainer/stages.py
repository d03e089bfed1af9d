"""agl-trainer's map of itself: its stages, lowest first, and the import graph over its modules, read from the
source by agl-core's functions (`agl.common.layout`). `packages/trainer/tests/test_trainer_layout.py` checks that no
module imports a stage above its own and that there are no import circles; the docs' architecture page draws the
stages and their folders from the same map.
"""

from __future__ import annotations

from pathlib import Path

from agl.common import layout

ROOT = Path(__file__).parent
# not a module of agl_trainer: the vLLM plugin is put on the PYTHONPATH of the vLLM servers agl starts on a CPU
OUTSIDE = ("agl_trainer.vllm_plugin",)

# (stage, what it does, the modules and packages it holds), lowest first: a module may import its own stage and the
# stages below it, never one above
STAGES: list[tuple[str, str, tuple[str, ...]]] = [
    (
        "base",
        "the run's config and options, models and their shape, the chat format, the backends' interfaces",
        (
            "agl_trainer.config",
            "agl_trainer.options",
            "agl_trainer.models",
            "agl_trainer.model_shape",
            "agl_trainer.chat_format",
            "agl_trainer.backends",
            "agl_trainer.stages",
        ),
    ),
    (
        "tracking",
        "what a run writes for people: metrics.jsonl, the learning curve, experiment trackers",
        ("agl_trainer.tracking",),
    ),
    (
        "policy",
        "the update: agl's own policy trainer (LoRA or full weights) and verl's actor workers on Ray",
        ("agl_trainer.policy", "agl_trainer.verl"),
    ),
    (
        "engines",
        "what generates, and how new weights reach it: embedded engine, vLLM servers, fleet, colocation",
        ("agl_trainer.engines",),
    ),
    ("plan", "`agl train --plan`: what a run on GPUs would start and whether it fits", ("agl_trainer.plan",)),
    (
        "run",
        "`agl train`'s loop: set-up, rollouts, a step's transitions and metrics, evaluation, checkpoints",
        ("agl_trainer.run",),
    ),
    (
        "cli",
        "use every stage: `agl train` and `agl engine`, the built-in examples, deprecated aliases",
        ("agl_trainer", "agl_trainer.cli", "agl_trainer.examples", "agl_trainer.loop", "agl_trainer.engine"),
    ),
]

# old module paths that user code may import, kept for one release as the new modules (with a warning)
DEPRECATED = {"agl_trainer.loop": "agl_trainer.run.loop", "agl_trainer.engine": "agl_trainer.engines.embedded"}


def stage(module: str) -> int:
    """The rank of the stage `module` belongs to: the longest prefix in `STAGES` that names it."""
    return layout.stage(module, STAGES)


def graph() -> dict[str, set[str]]:
    """Every module of agl_trainer → the agl_trainer modules it imports."""
    return {name: targets for name, targets in layout.graph(ROOT).items() if not name.startswith(OUTSIDE)}


def upward_imports(name: str, targets: set[str]) -> list[str]:
    """The imports of `name` that reach a stage above its own, described."""
    return layout.upward_imports(name, targets, STAGES)


def cycles(modules: dict[str, set[str]]) -> list[list[str]]:
    """The import circles among `modules` (a `graph`); `agl_trainer` itself is judged by what it names."""
    return layout.cycles(modules, ignore=frozenset({"agl_trainer"}))
