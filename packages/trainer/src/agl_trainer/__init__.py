"""agl-trainer: the embedded inference engine and the LightningRL training loop.

Nothing heavy is imported here (torch and transformers load with the modules that need them).

agl-trainer is laid out by its parts, each a folder, over a base of plain modules:

- the base: `config` (`TrainConfig`, `PolicyConfig`), `options` (flags and option files → a config), `models`
  (where models come from), `model_shape` (a model's sizes from its config.json), `chat_format` (messages ↔ prompt
  text) and `backends` (the interfaces engines and policy backends implement);
- `tracking`: metrics.jsonl, the learning curve, experiment trackers;
- `policy`: agl's own policy trainer and its update; `verl`: verl's actor workers, the other policy backend;
- `engines`: the embedded engine and its HTTP front, vLLM servers and their fleet, remote engines and the weights
  published to them, their checks, colocation;
- `plan`: `agl train --plan`, what a run on GPUs would start and whether it fits;
- `run`: `agl train`'s loop and what a step does (set-up, rollouts, transitions, metrics, evaluation, checkpoints);
- `cli` (`agl train`, `agl engine`) and `examples`, which use every part.

No module imports a stage above its own (base < tracking < policy, verl < engines < plan < run < cli), and no two
modules import each other: `agl_trainer.stages` is the map, `packages/trainer/tests/test_trainer_layout.py` checks it.
"""

__version__ = "0.1.0"
