"""`agl train --plan`: what a run on GPUs would start and whether it fits, resolved from config.json alone.

The data flow reads from the file names: `hardware` (the GPUs described or read off CUDA; `cluster`: read off a
Ray cluster) and the model's shape (`agl_trainer.model_shape`, its sizes from its config.json) → `memory` (per-GPU
estimates of an update and of a vLLM server) → `layout` (colocated or split, the trainer's ranks per node, vLLM's
parallelism) → `tool_parsers` (vLLM's parser per model family) → `build` (the plan: vLLM command lines, verl's
validated config, memory, warnings) → `cli` (the flags, and which hardware a plan is for) and `table` (the GPU
guide's table of plans).

The plan sits above the engines and verl (it writes their command lines and settings) and below the run.
"""
