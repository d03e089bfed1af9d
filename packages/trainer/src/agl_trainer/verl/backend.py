"""`VerlPolicy`: agl's `PolicyBackend` on verl's PPO actor worker (FSDP2, on Ray).

agl keeps LightningRL: the transitions come with their advantages and weights (`agl.learn.credit`), so `--strategy`
means the same with either trainer. verl does the rest of an update: log-probs, the loss (`agl_trainer.verl.loss`
says how agl's loss maps onto verl's, term for term), the optimiser (AdamW), gradient clipping, FSDP sharding over
`workers` data-parallel ranks, and checkpoints. The worker is driven the way `RayPPOTrainer` drives it
(`_compute_old_log_prob`, `_compute_ref_log_prob`, `_update_actor`), with a batch built from agl's transitions;
verl's own trainer loop is not used, since it insists on building its own rollout servers.

After an update the weights live in the Ray workers. The inference side gets them with `save_adapter(path)` (a
peft folder, what vLLM's `load_lora_adapter` and agl's `agl engine` read), `state_dict_for_engine()` (the LoRA
weights in peft's naming, or the full state dict) or `load_into(model)` (copies them into a local model in place:
the embedded engine's).

On a machine without CUDA the workers run on the CPU (`agl_trainer.verl.platform`); with CUDA, verl runs as it
does anywhere (one GPU per worker, NCCL).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from agl.learn.transitions import Transition
from agl_trainer.backends import UpdateStats
from agl_trainer.policy.off_policy import ImportanceWeights
from agl_trainer.policy.trainer import PolicyConfig
from agl_trainer.verl import import_verl
from agl_trainer.verl.batch import PackedBatch, pack, per_transition, response_values, to_worker_input
from agl_trainer.verl.cpu import cpu_micro_batch_tokens, cpu_worker_env, select_cpu_platform_here
from agl_trainer.verl.loss import agl_ppo_loss
from agl_trainer.verl.placement import VLLM_GPUS_ENV, reserve
from agl_trainer.verl.settings import VerlProfile, actor_settings, cpu_profile, cuda_profile, root_config, validate

log = logging.getLogger(__name__)

CHECKPOINT_META = "agl_verl.json"
# what a model folder holds besides its weights (copied from the base model when saving trained weights)
_MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
)


def _cuda_available() -> bool:
    return bool(torch.cuda.is_available())


class VerlPolicy:
    """agl's policy backend on verl's actor worker.

    `model_path`: a local Hugging Face model folder (`agl_trainer.models.resolve_model`). `config`: the same
    `PolicyConfig` as agl's own trainer (lr, clip range, KL β, grad clip, weight decay, LoRA rank/alpha/targets,
    `micro_batch_tokens` = verl's token budget per forward pass). `workers`: data-parallel ranks (FSDP2).
    `ray_address`: join that Ray cluster (every node needs agl-trainer[verl]); otherwise a local Ray is started
    with `num_cpus` (default: `workers`) and stopped by `close()`. `initial_adapter`: a peft LoRA folder to start
    from instead of a fresh adapter. `device`: "auto" (CUDA when present), "cpu" or "cuda". `overrides`: verl
    settings under `actor_rollout_ref`, as dotted keys (`{"actor.optim.betas": [0.9, 0.95]}`), applied last.
    `profile`: precision, checkpointing, attention and token budget (agl_trainer.verl.settings; by default the
    device's, with `config.micro_batch_tokens` as the budget; `agl train` passes its plan's).
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        config: PolicyConfig,
        *,
        pad_id: int | None = None,
        workers: int = 1,
        ray_address: str | None = None,
        num_cpus: int | None = None,
        initial_adapter: str | os.PathLike[str] | None = None,
        device: str = "auto",
        seed: int = 42,
        overrides: Mapping[str, Any] | None = None,
        profile: VerlProfile | None = None,
        placement: Sequence[int] | None = None,
        num_gpus: int | None = None,
        vllm_gpus: Sequence[int] = (),
    ) -> None:
        self.verl_version = import_verl()
        if workers < 1:
            raise ValueError(f"workers must be ≥ 1, got {workers}")
        # ranks per node: one pool per node, as verl's trainer builds them ([gpus_per_node] * nodes); one pool
        # larger than a node is a placement group Ray never schedules
        self.placement = list(placement) if placement is not None else [workers]
        if sum(self.placement) != workers or min(self.placement) < 1:
            raise ValueError(f"placement {self.placement} must give each of the {workers} workers a node")
        if config.kl_coef > 0 and not config.lora:
            raise ValueError("kl_coef > 0 needs LoRA (the reference is the base model with the adapter off)")
        if device == "auto":
            device = "cuda" if _cuda_available() else "cpu"
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
        if profile is None:
            profile = (
                cuda_profile(config.micro_batch_tokens, lora=config.lora) if device == "cuda" else cpu_profile(config)
            )
        elif profile.device != device:
            raise ValueError(f"a {profile.device} profile for a policy on {device}")
        self.profile = profile
        self.model_path = Path(model_path)
        self.config = config
        self.workers = workers
        self.device = device
        self.initial_adapter = Path(initial_adapter) if initial_adapter is not None else None
        self.pad_id = pad_id if pad_id is not None else _pad_id(self.model_path)
        self.vocab_size = _vocab_size(self.model_path)
        self.agent_adapters: dict[str, str] = {}  # one policy for every agent (per-agent LoRA: one VerlPolicy each)
        self.steps = 0
        self.timings: dict[str, float] = {}
        self._owns_ray = False
        self._wg: Any = None
        self._pool: Any = None
        t0 = time.perf_counter()
        self._start_ray(ray_address, num_cpus, num_gpus)
        self.timings["ray_s"] = time.perf_counter() - t0
        if config.lora and initial_adapter is None and profile.weights_dtype != "fp32":
            # verl would cast the adapter it builds to the base model's bf16: the workers write an fp32 one instead
            from agl_trainer.verl.worker import FRESH_ADAPTER_ENV

            self._worker_env[FRESH_ADAPTER_ENV] = str(seed)
        if vllm_gpus:  # the split layout: each rank checks Ray gave it none of vLLM's GPUs (placement.gpu_clash)
            self._worker_env[VLLM_GPUS_ENV] = ",".join(str(g) for g in vllm_gpus)
        try:
            self._root_config = self._verl_config(seed, overrides or {})
            self._start_workers()
        except BaseException:
            self.close()
            raise
        self.timings["workers_s"] = time.perf_counter() - t0 - self.timings["ray_s"]

    # ------------------------------------------------------------------------------------------ set-up

    def _start_ray(self, address: str | None, num_cpus: int | None, num_gpus: int | None = None) -> None:
        import ray

        self._worker_env: dict[str, str] = {}
        if self.device == "cpu":
            select_cpu_platform_here()
            self._worker_env.update(cpu_worker_env())
            if address is None:
                # the local machine's cores, shared by the ranks (Ray would give each actor one thread)
                from agl_trainer.verl.worker import THREADS_ENV

                self._worker_env[THREADS_ENV] = str(max(1, (os.cpu_count() or 1) // self.workers))
        if ray.is_initialized():
            return  # someone in this process already joined a cluster: share it, and leave it to them
        env = {"env_vars": {"TOKENIZERS_PARALLELISM": "false"}}
        if address is not None:
            # the workers' logs reach this process: an NCCL error on another node is otherwise invisible
            ray.init(address=address, runtime_env=env, log_to_driver=True)
        else:
            ray.init(
                num_cpus=num_cpus or self.workers,
                # split layout: vLLM holds the node's last GPUs, Ray hands out the first ones
                num_gpus=(num_gpus if num_gpus is not None else torch.cuda.device_count())
                if self.device == "cuda"
                else 0,
                include_dashboard=False,
                runtime_env=env,
                log_to_driver=self.device == "cuda",  # on GPUs NCCL's errors arrive only in the workers' logs
                configure_logging=False,
            )
        self._owns_ray = True

    def _verl_config(self, seed: int, overrides: Mapping[str, Any]) -> Any:
        """verl's `actor_rollout_ref` config: its defaults, then agl's settings for this device
        (agl_trainer.verl.settings, shared with `agl train --plan`), then `overrides`, checked by verl."""
        settings = actor_settings(
            self.model_path,
            self.config,
            self.profile,
            seed=seed,
            initial_adapter=self.initial_adapter,
            ranks_per_node=self.placement,
        )
        root = root_config(settings, overrides)
        validate(root, load_tokenizer=True)
        return root

    def _start_workers(self) -> None:
        import ray
        from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
        from verl.utils.config import omega_conf_to_dataclass

        from agl_trainer.verl.worker import AglActorWorker

        arr = self._root_config.actor_rollout_ref
        on_gpu = self.device == "cuda"
        free = ray.available_resources()
        need = {"CPU": float(self.workers), **({"GPU": float(self.workers)} if on_gpu else {})}
        short = {k: v for k, v in need.items() if free.get(k, 0.0) < v}
        if short:  # verl would wait for them for ever
            raise RuntimeError(
                f"{self.workers} verl worker(s) need {need} from Ray, which has {free.get('CPU', 0)} CPU and "
                f"{free.get('GPU', 0)} GPU free: start Ray with more (num_cpus=…) or use fewer workers"
            )
        # one CPU (and on CUDA one GPU) per worker: verl's default asks for 10 CPUs per worker
        pool = self._pool = RayResourcePool(process_on_nodes=self.placement, use_gpu=on_gpu, max_colocate_count=1)
        # the same groups verl would ask for, one per node, but waited for with a deadline (verl waits for ever)
        from verl.single_controller.ray.base import sort_placement_group_by_node_ip

        pool.pgs = sort_placement_group_by_node_ip(reserve(self.placement, gpu_resource="GPU" if on_gpu else None))
        worker = RayClassWithInitArgs(cls=ray.remote(AglActorWorker), config=arr, role="actor")
        self._wg = RayWorkerGroup(
            resource_pool=pool,
            ray_cls_with_init=worker,
            device_name="cuda" if on_gpu else "cpu",
            worker_env=self._worker_env,
        )
        self._wg.init_model()
        self._actor_config = omega_conf_to_dataclass(arr.actor)
        self._set_loss()
        self.threads = int(self._wg.torch_threads()[0])

    def _set_loss(self) -> None:
        """agl's loss (agl_trainer.verl.loss) in place of verl's plain `ppo_loss`, with the current KL β."""
        if self.config.kl_coef > 0 and not self.config.lora:
            raise ValueError("kl_coef > 0 needs LoRA (the reference is the base model with the adapter off)")
        self._loss_kl = float(self.config.kl_coef)
        self._wg.set_loss_fn(functools.partial(agl_ppo_loss, config=self._actor_config, kl_coef=self._loss_kl))

    # ------------------------------------------------------------------------------------------ PolicyBackend

    def _pack(self, transitions: Sequence[Transition], **kwargs: Any) -> PackedBatch:
        return pack(transitions, pad_id=self.pad_id, multiple_of=self.workers, balance=True, **kwargs)

    def _micro_batching(self, batch: PackedBatch) -> dict[str, Any]:
        """How verl splits `batch` into micro-batches on each rank, so that none exceeds the token budget.

        With remove-padding (flash-attn on CUDA) verl packs sequences without pad tokens and fills each micro-batch
        up to the budget of real tokens (`ppo_max_token_len_per_gpu`, from the config). Without it (a CPU, or CUDA
        without flash-attn) verl pads each micro-batch to its longest sequence, while its token-budget split
        (`rearrange_micro_batches`) counts real tokens only: one long transition among many short ones makes a
        padded micro-batch many times the budget. So there the micro-batches hold a fixed number k of sequences
        with k × the batch's longest ≤ the budget (k divides each rank's rows, as verl requires), and the padded
        micro-batch never exceeds the budget the plan charged."""
        longest = int(batch.tensors["attention_mask"].sum(dim=1).max())
        budget = int(self.profile.token_budget)
        if self.device == "cpu":
            budget = cpu_micro_batch_tokens(budget, self.vocab_size, longest)
        if self.profile.remove_padding:
            return {"max_token_len_per_gpu": budget}
        rows = batch.size // self.workers
        fits = max(1, budget // max(longest, 1))
        k = max(d for d in range(1, rows + 1) if rows % d == 0 and d <= fits)
        return {"use_dynamic_bsz": False, "micro_batch_size_per_gpu": k}

    def _log_probs(self, batch: PackedBatch, *, reference: bool = False) -> torch.Tensor:
        settings: dict[str, Any] = {"calculate_entropy": False, "compute_loss": False}
        if reference:
            settings["no_lora_adapter"] = True  # verl's ref_in_actor: the base model is the policy, adapter off
        td = to_worker_input(batch, **settings, **self._micro_batching(batch))
        output = self._wg.compute_log_prob(td)
        return response_values(output, "log_probs", td, batch)

    def logprobs(self, transitions: Sequence[Transition]) -> list[list[float]]:
        """The current policy's log-probs of each transition's response tokens, at its sampling temperature."""
        if not transitions:
            return []
        t0 = time.perf_counter()
        batch = self._pack(transitions)
        out = per_transition(self._log_probs(batch), batch)
        self.timings["logprobs_s"] = time.perf_counter() - t0
        return out

    def reference_logprobs(self, transitions: Sequence[Transition]) -> list[list[float]]:
        """The reference model's (the base model's: LoRA off) log-probs, as the KL term sees them."""
        if not self.config.lora:
            raise ValueError("the reference is the base model with the adapter off: it needs LoRA")
        batch = self._pack(transitions)
        return per_transition(self._log_probs(batch, reference=True), batch)

    def update(self, transitions: Sequence[Transition]) -> UpdateStats:
        """One optimizer step on `transitions` in verl's worker; skips and recomputes as agl's trainer does."""
        stats = UpdateStats(transitions=len(transitions))
        keep_zero = self.config.kl_coef > 0  # a zero advantage still has a KL term
        useful = [t for t in transitions if t.weight > 0 and (keep_zero or t.advantage != 0.0)]
        stats.skipped_zero_advantage = len(transitions) - len(useful)
        if not useful:
            return stats
        t0 = time.perf_counter()
        if float(self.config.kl_coef) != self._loss_kl:  # the config changed since the last update
            self._set_loss()
        missing = [t for t in useful if t.logprobs is None or len(t.logprobs) != len(t.response_ids)]
        if missing:
            for t, lp in zip(missing, self.logprobs(missing), strict=True):
                t.logprobs = lp
            stats.recomputed_logprobs = len(missing)
        n = len(useful)
        total_weight = sum(t.weight for t in useful)
        scale = [t.weight * n / total_weight for t in useful]  # c_i: see agl_trainer.verl.loss
        batch = self._pack(
            useful, advantages=[c * t.advantage for c, t in zip(scale, useful, strict=True)], seq_weights=scale
        )
        extra = {}
        if self.config.is_cap is not None:
            extra["rollout_is_weights"] = self._off_policy(batch, stats)
        if self.config.kl_coef > 0:
            ref = self._log_probs(batch, reference=True)
            padded = torch.zeros_like(batch.tensors["old_log_probs"])
            padded[batch.positions] = ref
            extra["ref_log_prob"] = padded
        td = to_worker_input(
            batch,
            extra,
            calculate_entropy=False,
            distillation_use_topk=False,
            distillation_only=False,
            global_batch_size=n,  # the loss is a mean over the real sequences; placeholder rows carry none
            mini_batch_size=batch.size,  # one mini-batch: one optimizer step per update, as agl's trainer
            epochs=1,
            seed=self.steps,
            dataloader_kwargs={"shuffle": False},
            compute_loss=True,
            **self._micro_batching(batch),
        )
        from verl.utils import tensordict_utils as tu

        metrics = tu.get(self._wg.update_actor(td), "metrics")
        self.steps += 1
        self._fill(stats, metrics)
        self.timings["update_s"] = time.perf_counter() - t0
        return stats

    def _off_policy(self, batch: PackedBatch, stats: UpdateStats) -> torch.Tensor:
        """The off-policy correction (agl_trainer.policy.off_policy), as agl's trainer applies it: π_old recomputed by the
        worker replaces the behaviour log-probs the clip is taken against, and the per-token weights π_old / μ go
        to verl's loss as `rollout_is_weights`, which it multiplies the policy-gradient term by
        (verl.workers.utils.losses.ppo_loss)."""
        rows = batch.positions
        behaviour = batch.tensors["old_log_probs"]
        proximal = self._log_probs(batch)  # the transitions' rows, in their order
        mask = batch.tensors["response_mask"][rows]
        importance = ImportanceWeights(self.config)
        weights = torch.zeros_like(behaviour)
        weights[rows] = importance.add(proximal - behaviour[rows], mask).to(weights.dtype)
        old = behaviour.clone()
        old[rows] = torch.where(mask.bool(), proximal.to(old.dtype), old[rows])
        batch.tensors["old_log_probs"] = old
        stats.extra.update(importance.metrics())
        return weights

    @staticmethod
    def _fill(stats: UpdateStats, metrics: Mapping[str, Any]) -> None:
        def total(key: str) -> float:
            value = metrics.get(key)
            if value is None:
                return 0.0
            values = value if isinstance(value, list | tuple) else [value]
            return float(sum(float(v) for v in values))

        tokens = total("agl/tokens")
        stats.tokens = round(tokens)
        stats.loss = total("loss")
        stats.pg_loss = total("actor/pg_loss")
        denominator = max(tokens, 1.0)
        stats.kl = total("agl/kl") / denominator
        stats.clip_fraction = total("agl/clipped") / denominator
        stats.ratio_mean = total("agl/ratio") / denominator
        grad_norm = total("grad_norm")
        stats.grad_norm = grad_norm if math.isfinite(grad_norm) else float("nan")
        stats.micro_batches = round(total("agl/micro_batches"))
        if "agl/kl_loss" in metrics:
            stats.extra["kl_loss"] = total("agl/kl_loss")

    # ------------------------------------------------------------------------------------------ GPU turns

    def to_device(self) -> None:
        """The actor's weights, gradients and optimizer moments back on the accelerator (agl_trainer.engines.colocation).
        verl's `to` takes "device" (its name for the accelerator) or "cpu", nothing else; on a CPU machine both
        name the CPU and the same calls run, so the sequence tested here is the one a GPU runs."""
        self._wg.to("device", model=True, optimizer=True, grad=True)

    def to_host(self) -> None:
        """The actor's state to host memory, and the accelerator's cache emptied on every rank
        (`AglActorWorker.to`), freeing the GPUs for vLLM while it generates."""
        self._wg.to("cpu", model=True, optimizer=True, grad=True)

    def parameter_dtypes(self) -> dict[str, list[str]]:
        """The dtypes of the actor's trained and frozen parameters (`AglActorWorker.parameter_dtypes`)."""
        return dict(self._wg.parameter_dtypes()[0])

    def peak_memory(self, reset: bool = False) -> list[dict[str, int]]:
        """Each rank's peak memory since the start or the last reset (`AglActorWorker.peak_memory`)."""
        return list(self._wg.peak_memory(reset=reset))

    def moves(self) -> list[dict[str, Any]]:
        """Rank 0's log of the moves above, as verl's worker made them (`AglActorWorker.moves`)."""
        return list(self._wg.moves()[0])

    # ------------------------------------------------------------------------------------------ weights out

    def state_dict_for_engine(self) -> dict[str, torch.Tensor]:
        """The trained weights as full CPU tensors: with LoRA the adapter in peft's naming
        (`…q_proj.lora_A.weight`, what `set_peft_model_state_dict` takes), else the model's state dict."""
        t0 = time.perf_counter()
        exported = next(e for e in self._wg.export_weights() if e is not None)
        self._peft_config = exported["peft_config"]
        self.timings["export_s"] = time.perf_counter() - t0
        return dict(exported["state"])

    def load_into(self, model: Any, adapter: str = "default") -> None:
        """Copy the trained weights into a local model in place: with LoRA a peft model whose adapter `adapter`
        has the same rank and targets (`agl_trainer.policy.trainer.wrap_lora` with this policy's config), else the plain
        model. The embedded engine then generates with them."""
        state = self.state_dict_for_engine()
        with torch.no_grad():
            if self.config.lora:
                from peft import set_peft_model_state_dict

                result = set_peft_model_state_dict(model, state, adapter_name=adapter)
                unexpected = list(getattr(result, "unexpected_keys", []) or [])
                if unexpected:
                    raise ValueError(f"the local model has no LoRA weights named like {unexpected[:3]}")
            else:
                target = model.get_base_model() if hasattr(model, "get_base_model") else model
                missing, unexpected = target.load_state_dict(state, strict=False)
                if unexpected or [m for m in missing if "rotary" not in m]:
                    raise ValueError(f"state dict mismatch: missing {missing[:3]}, unexpected {unexpected[:3]}")

    def adapter_folder(self, path: str | os.PathLike[str], adapter: str | None = None) -> Path:
        """Where `save(path)` puts the adapter (agl's trainer's layout): `path/adapter`."""
        return Path(path) / "adapter"

    def save_adapter(self, path: str | os.PathLike[str]) -> Path:
        """The LoRA adapter as a peft folder (`adapter_config.json`, `adapter_model.safetensors`) at `path`."""
        if not self.config.lora:
            raise ValueError("save_adapter needs LoRA: a fully fine-tuned policy has no adapter (save_pretrained)")
        from safetensors.torch import save_file

        state = self.state_dict_for_engine()
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        config = dict(self._peft_config or {})
        config["base_model_name_or_path"] = str(self.model_path)
        config["inference_mode"] = True
        (folder / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True, default=str))
        save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "adapter_model.safetensors"))
        return folder

    def save_pretrained(self, path: str | os.PathLike[str], dtype: torch.dtype | None = None) -> Path:
        """A fully fine-tuned policy as a Hugging Face model folder (what vLLM's `reload_weights` reads): the actor's
        weights, gathered on rank 0, written as safetensors (in `dtype`, e.g. the server's bf16; default: as
        trained) beside the base model's config and tokenizer files. Nothing is loaded into this process but the
        state dict: the driver holds no model of its own."""
        import shutil

        from safetensors.torch import save_file

        if self.config.lora:
            raise ValueError("save_pretrained is for full fine-tuning; a LoRA policy saves its adapter (save_adapter)")
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        state = self.state_dict_for_engine()
        if dtype is not None:
            state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
        save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
        for name in _MODEL_FILES:
            source = self.model_path / name
            if source.is_file():
                shutil.copyfile(source, folder / name)
        return folder

    # ------------------------------------------------------------------------------------------ checkpoints

    def publish_adapters(self, path: str | os.PathLike[str]) -> None:
        """Only what an engine loads: the adapter, gathered from the ranks and written once, by this process (a
        publication is not a checkpoint: verl's shards and optimizer state stay where checkpoints go)."""
        self.save_adapter(self.adapter_folder(path))

    def save(self, path: str | os.PathLike[str]) -> None:
        """verl's checkpoint (model or adapter shards, optimizer, scheduler, RNG) under `path/verl`, and with LoRA
        the adapter as a peft folder under `path/adapter`."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self._wg.save_checkpoint(str((path / "verl").resolve()), None, self.steps, None)
        if self.config.lora:
            self.save_adapter(self.adapter_folder(path))
        meta = {"steps": self.steps, "workers": self.workers, "lora": self.config.lora, "verl": self.verl_version}
        (path / CHECKPOINT_META).write_text(json.dumps(meta, indent=2))

    def load(self, path: str | os.PathLike[str]) -> None:
        path = Path(path)
        meta = json.loads((path / CHECKPOINT_META).read_text())
        if int(meta["workers"]) != self.workers:
            raise ValueError(
                f"{path} was saved by {meta['workers']} verl workers, this policy has {self.workers}: verl's "
                "checkpoints are sharded per rank; resume with the same number of workers"
            )
        if bool(meta["lora"]) != bool(self.config.lora):
            raise ValueError(f"{path} holds a {'LoRA' if meta['lora'] else 'fully fine-tuned'} policy")
        self._wg.load_checkpoint(str((path / "verl").resolve()), None, False)
        self.steps = int(meta["steps"])

    # ------------------------------------------------------------------------------------------ lifetime

    def close(self) -> None:
        import ray

        wg, self._wg = self._wg, None
        pool, self._pool = self._pool, None
        if wg is not None:
            for handle in getattr(wg, "workers", []) or []:
                try:
                    ray.kill(handle)
                except Exception:  # already gone
                    pass
        if pool is not None and ray.is_initialized():
            from ray.util import remove_placement_group

            for group in pool.pgs or []:  # frees the workers' CPUs (and GPUs) in a Ray that outlives this policy
                remove_placement_group(group)
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
        self._owns_ray = False

    def __enter__(self) -> VerlPolicy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _vocab_size(model_path: Path) -> int:
    import json

    config = json.loads((model_path / "config.json").read_text())
    return int(config.get("vocab_size") or config.get("text_config", {}).get("vocab_size") or 0)


def _pad_id(model_path: Path) -> int:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise ValueError(f"{model_path}'s tokenizer has neither a pad nor an eos token: pass pad_id")
    return int(pad)


@contextmanager
def verl_policy(*args: Any, **kwargs: Any) -> Iterator[VerlPolicy]:
    policy = VerlPolicy(*args, **kwargs)
    try:
        yield policy
    finally:
        policy.close()
