"""How much memory a training update and a vLLM server take on one GPU: the estimate the plan checks.

The update (verl's FSDP actor, or agl's own trainer: the same model code), per GPU, with `ranks` data-parallel
ranks of which `shards` hold one copy of the state between them (FSDP's shard group: every rank, or with HSDP on
several nodes one node's ranks, the copy replicated across nodes):

- weights: the frozen base in the compute dtype (LoRA), or fp32 master weights (full fine-tuning), sharded; plus
  the unsharded compute-dtype copies FSDP gathers for the layers in flight (two: one computing, one prefetched)
  and, for the root module, the embedding. FSDP2 makes those copies at one rank too (its world-size-1 path
  copies each shard into a freshly allocated unsharded buffer, `FSDPParamGroup.wait_for_unshard`), so verl's
  actor (`fsdp`) is charged them at any number of ranks; agl's own trainer, unwrapped, never;
- gradients and AdamW's two moments: 4 + 8 bytes per trainable parameter, sharded;
- activations for a micro-batch of `tokens`: what one decoder layer keeps for backward is about
  tokens × (3·hidden + 2·q_dim + 3·intermediate) values for its own operations (RMSNorm, rotary, attention output,
  the MLP's gate and the two factors of its product; attention keeps no seq² matrix with flash/sdpa kernels), and
  with full fine-tuning also the inputs of the projections being trained (2·hidden + q_dim + intermediate more):
  a frozen projection needs no input to compute its input's gradient. With gradient checkpointing only each
  layer's input is kept, and one layer is recomputed (and differentiated) at a time;
- weights: the frozen base of a LoRA policy as verl loads it (`model_dtype`: the compute dtype, bf16 on CUDA,
  agl_trainer.verl.settings), its adapter in fp32 (weights, gradients, moments);
- logits: tokens × vocab values, as many copies at the peak as the path that turns them into token log-probs
  keeps (`LOGIT_COPIES`, per path, in the compute dtype c): verl with flash-attn's cross-entropy (remove-padding)
  keeps the logits, their temperature-scaled copy and, in backward, the raw logits' gradient (the kernel writes
  its own gradient in place: `inplace_backward`); verl without it (`logprobs_from_logits_v2`, padded batches) also
  copies the real tokens' rows out of the padded batch (`torch.cat` in the no-padding layout) and holds two
  gradients at once in backward, and in bf16 it keeps each row's log-softmax; agl's own trainer makes an fp32
  copy, its log-softmax and their two gradients (c + 12 bytes);
- padding: none counted beyond the budget. With remove-padding there is none; without it agl gives verl
  micro-batches of a fixed number of sequences whose padded size stays within the budget
  (`VerlPolicy._micro_batching`);
- the CUDA context and allocator slack.

vLLM takes `gpu_memory_utilization` × the GPU's memory while awake (weights, KV cache, CUDA graphs), and about the
CUDA context and graphs while asleep (sleep mode level 1 offloads the weights and drops the KV cache).

`benchmarks/perf/bench_verl_memory.py` checks the formula against the peak of verl's real worker on this machine's
CPU (fp32, the no-flash-attn path) for the bundled model; the flash-attn path and bf16 only a GPU can confirm.
"""

from __future__ import annotations

from dataclasses import dataclass

from agl_trainer.model_shape import ModelShape

GIB = float(2**30)
CUDA_CONTEXT_GIB = 1.0  # per process holding a CUDA context (torch + NCCL), as nvidia-smi shows it
ALLOCATOR_SLACK = 0.10  # fragmentation of PyTorch's caching allocator, on top of what is live
VLLM_ASLEEP_GIB = 1.5  # a sleeping vLLM: its CUDA context and graphs stay


@dataclass(frozen=True)
class UpdateSetup:
    shape: ModelShape
    tokens: int  # micro-batch token budget per GPU (verl's ppo_max_token_len_per_gpu)
    ranks: int = 1  # data-parallel ranks of the actor
    # ranks one copy of the weights, gradients and moments is sharded over (verl's `fsdp_size`: HSDP shards within
    # a node and replicates across nodes); None: every rank
    shard_group: int | None = None
    fsdp: bool = False  # wrapped by FSDP (verl's actor): gathered compute copies exist even at one rank
    lora: bool = True
    lora_rank: int = 16
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    compute_bytes: int = 2  # bf16 on CUDA; 4 for fp32 (a CPU)
    gradient_checkpointing: bool = True
    # how logits become token log-probs: "agl" (agl's own trainer), "flash" (verl with flash-attn's cross-entropy),
    # "torch" (verl without flash-attn), "fused" (verl's fused kernels: no vocabulary-wide tensor kept)
    logits_path: str = "agl"
    temperature_scaled: bool = True  # sampled at T ≠ 1: verl divides the logits into a new tensor
    cuda: bool = True  # a CUDA context and the caching allocator's slack
    # positions whose logits are computed: verl's actor, every token; agl's own trainer, response tokens only
    logit_tokens: int | None = None

    @property
    def shards(self) -> int:
        """How many ranks share one copy of the sharded state (verl: `fsdp_size` < 0 or ≥ the ranks is all)."""
        if self.shard_group is None or self.shard_group < 1:
            return self.ranks
        return min(self.shard_group, self.ranks)

    @property
    def trainable(self) -> int:
        if self.lora:
            return self.shape.lora_params(self.lora_rank, self.lora_targets)
        return self.shape.params


def update_memory(setup: UpdateSetup) -> dict[str, float]:
    """Each part of an update's peak on one GPU, in GiB, and their `total`."""
    s, c = setup.shape, setup.compute_bytes
    shards = setup.shards
    gathered = (2 * s.layer_params + s.vocab * s.hidden) * c if setup.fsdp or setup.ranks > 1 else 0
    base = s.params * (c if setup.lora else 4) / shards
    q_dim = s.heads * s.head_dim
    values = s.layer_values_per_token  # what the layer's own operations need for backward
    if not setup.lora:
        values += 2 * s.hidden + q_dim + s.intermediate  # trained projections also keep their inputs
    per_layer = setup.tokens * values * c
    if setup.gradient_checkpointing:
        activations = s.layers * setup.tokens * s.hidden * c + 2 * per_layer
    else:
        activations = s.layers * per_layer + per_layer  # + the layer whose gradients are being computed
    logit_tokens = setup.tokens if setup.logit_tokens is None else setup.logit_tokens
    logits = logit_tokens * s.vocab * logit_bytes(setup.logits_path, c, temperature_scaled=setup.temperature_scaled)
    parts = {
        "weights": (base + gathered + (setup.trainable * 4 / shards if setup.lora else 0)) / GIB,
        "gradients": setup.trainable * 4 / shards / GIB,
        "optimizer": setup.trainable * 8 / shards / GIB,
        "activations": activations / GIB,
        "logits": logits / GIB,
    }
    live = sum(parts.values())
    parts["cuda_context_and_slack"] = (CUDA_CONTEXT_GIB + ALLOCATOR_SLACK * live) if setup.cuda else 0.0
    parts["total"] = sum(parts.values())
    return {k: round(v, 3) for k, v in parts.items()}


def logit_bytes(path: str, c: int, *, temperature_scaled: bool = True) -> int:
    """Bytes per token and vocabulary entry that turning logits into token log-probs holds at its peak, on `path`
    (see the module's docstring), in compute dtype of `c` bytes."""
    scaled = c if temperature_scaled else 0
    if path == "agl":
        return c + 12
    if path == "fused":
        return c
    if path == "flash":
        return 2 * c + scaled  # logits, the raw logits' gradient; the scaled copy holds the kernel's own gradient
    if path == "torch":
        # logits, the real rows' copy, two gradients in backward; bf16 keeps each row's log-softmax
        return 4 * c + scaled + (c if c < 4 else 0)
    raise ValueError(f"unknown logits path {path!r}: agl, flash, torch or fused")


def vllm_kv_bytes_per_token(shape: ModelShape, tensor_parallel: int, kv_bytes: int = 2) -> float:
    """KV cache per token on one GPU of a vLLM server: keys and values of every layer, split over TP ranks."""
    return 2 * shape.layers * shape.kv_dim * kv_bytes / tensor_parallel


def vllm_memory(
    shape: ModelShape, *, gpu_memory_gib: float, utilization: float, tensor_parallel: int
) -> dict[str, float]:
    """What a vLLM server holds on each of its GPUs while awake, in GiB, and how many tokens its KV cache holds."""
    budget = utilization * gpu_memory_gib
    weights = shape.params * 2 / tensor_parallel / GIB
    workspace = 1.5 + CUDA_CONTEXT_GIB  # activations of the largest batch, CUDA graphs, the context
    kv = max(0.0, budget - weights - workspace)
    return {
        "budget": round(budget, 3),
        "weights": round(weights, 3),
        "workspace": round(workspace, 3),
        "kv_cache": round(kv, 3),
        "kv_tokens": int(kv * GIB / vllm_kv_bytes_per_token(shape, tensor_parallel)),
    }
