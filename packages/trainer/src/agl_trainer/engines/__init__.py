"""Engines: what generates, and how the policy's weights reach it.

- `embedded`: the embedded engine (`Engine`), token-exact batched generation with the very model being trained;
  `serving` puts an OpenAI-compatible HTTP front on it (`agl engine`), `lora_weights` loads and drops LoRA adapters
  in it while it serves;
- `vllm_server`: vLLM as a server agl starts and stops (`--engine vllm`); `fleet`: one server per GPU node of a Ray
  cluster; `fan_out`: a request asked of every server at once;
- `remote`: an engine in another process set up for a run (one agl starts or one given by `--engine-url`);
  `publish`: the policy's new weights published to it (adapters by name, or full weights reloaded); `check`: its
  log-probs checked against the trainer's before training;
- `colocation`: vLLM and the trainer taking turns on the same GPUs.

Engines build on the policy (`agl_trainer.policy`) and on the interfaces in `agl_trainer.backends`; they never
import the run, the plan or verl.
"""
