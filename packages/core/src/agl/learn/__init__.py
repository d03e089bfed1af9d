"""Learn: the trainer's side of agl-core. Stored rollouts become transitions, and transitions get credit.

- `selection`: which agents' calls train (`--agents`, `AGL_TRAIN_AGENTS`);
- `air`: automatic intermediate rewards from what the trace shows (a tool that failed, an answer that does not
  parse);
- `transitions`: a rollout's trainable calls as `(prompt ids, response ids, reward)` transitions, turns that extend
  each other merged;
- `credit`: LightningRL's credit assignment (broadcast, discounted, GRPO per task, per-step groups).

Learn reads rollouts as `agl.common.trainable` records (from the store in process, or over HTTP through
`agl.client`); it imports neither the store nor the server, and nothing of the capture side.
"""
