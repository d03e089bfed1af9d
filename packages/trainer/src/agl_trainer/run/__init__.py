"""The run: `agl train`'s loop and everything a step does.

- `loop`: `TrainingRun`, the LightningRL loop on one machine;
- `setup`: the run's backends set up before its first step (the plan, vLLM, the policy trainer, the engine);
- `rollouts`: a step's rollouts enqueued, waited for (`waiting`) and read back;
- `step_transitions`: a step's rollouts → transitions, credit assigned, the calls too stale to train on left out
  (`staleness`); `step_metrics`: what a step records and prints;
- `evaluation`: the held-out evaluation; `checkpoints`: saving and resuming.

The run sits on top of the trainer's other parts: the plan, the engines, the policy (agl's or verl's) and tracking.
"""
