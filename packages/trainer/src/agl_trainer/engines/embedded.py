"""The embedded inference engine: token-exact generation with a local transformers model, batched.

Requests arrive from any thread or event loop; a single generation thread takes whatever is waiting (up to
`max_batch`, after a short gathering window) and decodes it together: left-padded prefill, then one token per
step for every sequence still running, with a KV cache. Sequences in one batch may differ in length, sampling
parameters and stop strings; requests for different LoRA adapters go in different batches. The adapter named
`base` (`BASE_MODEL`) is the model with every adapter switched off: with one policy per agent, the agents that
are not trained are served by it.

Prefix caching: agents send the same long beginning (system prompt, tool descriptions, examples) with every
call, and on a CPU the prompt's forward pass costs more than the decoding. The key/value cache of the longest
prefix shared by a batch is computed once, kept (a few entries, least recently used first out) and reused by
later batches that share any part of it; it is dropped whenever the weights change (`weights_changed`). It is
bounded by bytes (`PREFIX_CACHE_BYTES`, least recently used out first), not by entries: an entry's size follows
its prefix's length, which one agent's prompt can make large.

What a result holds, exactly: `token_ids` are the ids the model generated, up to and including the token that
ended the sequence (EOS, or the one that completed a stop string); `logprobs` are the log-probs of those ids
under the distribution they were sampled from, log softmax(logits / temperature) — the behaviour policy the
trainer's ratio compares with, computed by the trainer at the same temperature (greedy requests: temperature 1;
top-p truncation is not reflected, and the proxy stores top-p samples as not trainable); `text` is the decoded
answer without EOS and cut before a stop string.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from agl_trainer.policy.packing import common_prefix_len, pack

log = logging.getLogger(__name__)

BASE_MODEL = "base"  # the adapter name that means "no adapter": the base model as loaded


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop: Sequence[str] = ()
    seed: int | None = None
    adapter: str | None = None  # a LoRA adapter loaded in the engine; None: the model as it is
    on_token: Callable[[int, float], None] | None = None  # called from the engine thread for each new token


@dataclass
class GenerationResult:
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" (EOS or a stop string) or "length"
    prompt_tokens: int


@dataclass
class _Job:
    request: GenerationRequest
    future: Future[GenerationResult]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    done: bool = False
    finish_reason: str = "length"
    stop_at_text: int | None = None  # where a stop string began in the decoded text


PREFIX_CACHE_BYTES = 256 * 2**20


def cache_bytes(past: Any) -> int:
    """The bytes of a key/value cache's tensors."""
    return sum(int(t.nbytes) for layer in past.layers for t in (layer.keys, layer.values) if t is not None)


class _PrefixCache:
    """Key/value caches of token prefixes (batch size 1), per adapter, least recently used first out, within
    `max_bytes` in all."""

    def __init__(self, max_bytes: int = PREFIX_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.entries: OrderedDict[tuple[str | None, tuple[int, ...]], tuple[Any, int]] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.reused_tokens = 0

    def best(self, adapter: str | None, tokens: Sequence[int]) -> tuple[Any, int]:
        """A copy of the cached entry sharing the longest beginning with `tokens`, cut to that length."""
        best_key, best_len = None, 0
        for key in self.entries:
            if key[0] == adapter:
                m = common_prefix_len(key[1], tokens)
                if m > best_len:
                    best_key, best_len = key, m
        if best_key is None:
            return None, 0
        self.entries.move_to_end(best_key)
        past = copy.deepcopy(self.entries[best_key][0])
        if best_len < len(best_key[1]):
            past.crop(best_len - len(best_key[1]))  # a negative count: drop that many tokens from the end
        self.hits += 1
        self.reused_tokens += best_len
        return past, best_len

    def put(self, adapter: str | None, tokens: Sequence[int], past: Any) -> None:
        size = cache_bytes(past)
        if size > self.max_bytes:
            return  # larger than the whole cache: kept by nobody
        key = (adapter, tuple(tokens))
        if key in self.entries:
            self.bytes -= self.entries.pop(key)[1]
        self.entries[key] = (copy.deepcopy(past), size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            self.bytes -= self.entries.popitem(last=False)[1][1]

    def clear(self) -> None:
        self.entries.clear()
        self.bytes = 0


class Engine:
    """Batched generation with one model; `generate` may be called from any thread."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch: int = 8,
        batch_window_s: float = 0.02,
        max_context: int | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.batch_window_s = batch_window_s
        self.max_context = max_context or int(getattr(model.config, "max_position_embeddings", 2048))
        self.device = next(model.parameters()).device
        self.eos_ids = self._eos_ids()
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.lock = threading.RLock()  # held while generating; the trainer takes it to change weights
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self.default_adapter: str | None = None  # used for requests that name none, when the model has adapters
        self.prefix_cache = _PrefixCache()
        self.batches = 0
        self.generated_tokens = 0

    def _eos_ids(self) -> list[int]:
        ids: set[int] = set()
        for source in (getattr(self.model, "generation_config", None), self.model.config, self.tokenizer):
            value = getattr(source, "eos_token_id", None)
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(v) for v in value)
        if not ids:
            raise ValueError("the model has no EOS token id: generation could never stop")
        return sorted(ids)

    # ------------------------------------------------------------------------------------------ API

    def start(self) -> Engine:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="agl-engine", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(30)
            self._thread = None

    def weights_changed(self) -> None:
        """Call after changing the model's weights: cached keys/values were computed with the old ones."""
        with self.lock:
            self.prefix_cache.clear()

    def stage(self) -> None:
        """Nothing to write: the engine generates with the very model being trained."""

    def serve(self) -> None:
        self.weights_changed()

    def submit(self, request: GenerationRequest) -> Future[GenerationResult]:
        if not request.prompt_ids:
            raise ValueError("empty prompt")
        if request.max_tokens < 1:
            raise ValueError(f"max_tokens must be ≥ 1, got {request.max_tokens}")
        room = self.max_context - len(request.prompt_ids)
        if room < 1:
            raise ValueError(
                f"the prompt has {len(request.prompt_ids)} tokens; this model's context is {self.max_context}"
            )
        request.max_tokens = min(request.max_tokens, room)
        future: Future[GenerationResult] = Future()
        self.start()
        self._queue.put(_Job(request, future))
        return future

    def generate(self, request: GenerationRequest) -> GenerationResult:
        return self.submit(request).result()

    def generate_many(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        futures = [self.submit(r) for r in requests]
        return [f.result() for f in futures]

    # ---------------------------------------------------------------------------------- the thread

    def _run(self) -> None:
        pending: list[_Job] = []
        while True:
            if not pending:
                job = self._queue.get()
                if job is None:
                    return
                pending.append(job)
            deadline = time.monotonic() + self.batch_window_s
            while len(pending) < self.max_batch * 4:
                try:
                    job = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if job is None:
                    self._queue.put(None)
                    break
                pending.append(job)
            adapter = pending[0].request.adapter
            batch = [j for j in pending if j.request.adapter == adapter][: self.max_batch]
            pending = [j for j in pending if j not in batch]
            try:
                with self.lock:
                    self._generate(batch)
            except Exception as exc:  # a bad batch fails its requests, not the engine
                log.exception("generation failed")
                for j in batch:
                    if not j.future.done():
                        j.future.set_exception(exc)

    def _adapter_active(self, adapter: str | None) -> contextlib.AbstractContextManager[Any]:
        """A context in which the model runs with `adapter` (or the default adapter) active."""
        adapter = adapter or self.default_adapter
        if adapter is None:
            return contextlib.nullcontext()
        if not isinstance(getattr(self.model, "peft_config", None), dict):  # a plain model: no adapters
            if adapter == BASE_MODEL:
                return contextlib.nullcontext()
            raise ValueError(f"adapter {adapter!r} asked for, but the model has no adapters")
        if adapter == BASE_MODEL:
            return self.model.disable_adapter()  # type: ignore[no-any-return]
        self.model.set_adapter(adapter)
        return contextlib.nullcontext()

    def _prefix_kv(self, model: Any, adapter: str | None, prefix: list[int]) -> Any:
        """A batch-1 key/value cache covering exactly `prefix`, from the prefix cache where possible."""
        from transformers import DynamicCache

        past, done = self.prefix_cache.best(adapter, prefix)
        if past is None:
            past = DynamicCache()
        if done < len(prefix):
            ids = torch.tensor([prefix[done:]], dtype=torch.long, device=self.device)
            positions = torch.arange(done, len(prefix), device=self.device).unsqueeze(0)
            model(input_ids=ids, position_ids=positions, past_key_values=past, use_cache=True, logits_to_keep=1)
        self.prefix_cache.put(adapter, prefix, past)
        return past

    @torch.no_grad()
    def _generate(self, jobs: list[_Job]) -> None:
        with self._adapter_active(jobs[0].request.adapter):
            self._generate_batch(jobs, jobs[0].request.adapter or self.default_adapter)

    def _generate_batch(self, jobs: list[_Job], adapter: str | None) -> None:
        model = self.model
        n = len(jobs)
        prompts = [j.request.prompt_ids for j in jobs]
        # every prompt keeps at least one token of its own: the last one's logits start the decoding
        packed = pack(prompts, prefix_limit=min(len(p) for p in prompts) - 1, pad_id=self.pad_id)
        past = None
        if packed.prefix:
            past = self._prefix_kv(model, adapter, packed.prefix)
            if n > 1:
                past.batch_repeat_interleave(n)
        input_ids = packed.ids.to(self.device)
        attention = packed.attention.to(self.device)
        positions = packed.positions.to(self.device)
        generators = [self._generator(j.request.seed) for j in jobs]
        max_steps = max(j.request.max_tokens for j in jobs)
        out = model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            past_key_values=past,
            use_cache=True,
            logits_to_keep=1,
        )
        past = out.past_key_values
        logits = out.logits[:, -1, :]
        next_pos = positions[:, -1:] + 1
        # the temperature each sequence samples with: its log-probs are those of softmax(logits / T)
        temperatures = torch.tensor(
            [[j.request.temperature if j.request.temperature > 0 else 1.0] for j in jobs], device=logits.device
        )
        for _ in range(max_steps):
            logprobs = torch.log_softmax(logits.float() / temperatures, dim=-1)
            tokens = [
                self._sample(logits[i], j.request, generators[i]) if not j.done else self.pad_id
                for i, j in enumerate(jobs)
            ]
            for i, j in enumerate(jobs):
                if not j.done:
                    self._accept(j, tokens[i], float(logprobs[i, tokens[i]]))
            if all(j.done for j in jobs):
                break
            step_ids = torch.tensor(tokens, dtype=torch.long, device=self.device).unsqueeze(1)
            attention = torch.cat([attention, torch.ones((n, 1), dtype=torch.long, device=self.device)], dim=1)
            out = model(
                input_ids=step_ids,
                attention_mask=attention,
                position_ids=next_pos,
                past_key_values=past,
                use_cache=True,
            )
            past = out.past_key_values
            logits = out.logits[:, -1, :]
            next_pos = next_pos + 1
        self.batches += 1
        for j in jobs:
            self.generated_tokens += len(j.tokens)
            j.future.set_result(self._result(j))

    @staticmethod
    def _generator(seed: int | None) -> torch.Generator | None:
        if seed is None:
            return None
        g = torch.Generator()
        g.manual_seed(seed)
        return g

    @staticmethod
    def _sample(logits: torch.Tensor, request: GenerationRequest, generator: torch.Generator | None) -> int:
        if request.temperature <= 0:
            return int(torch.argmax(logits))
        scaled = logits.float().cpu() / request.temperature
        probs = torch.softmax(scaled, dim=-1)
        if request.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < request.top_p
            sorted_probs = sorted_probs * keep
            probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
        return int(torch.multinomial(probs, 1, generator=generator))

    def _accept(self, job: _Job, token: int, logprob: float) -> None:
        job.tokens.append(token)
        job.logprobs.append(logprob)
        if job.request.on_token is not None:
            job.request.on_token(token, logprob)
        if token in self.eos_ids:
            job.done, job.finish_reason = True, "stop"
        elif job.request.stop:
            # decode only the tail: a stop string can only have been completed by the newest tokens
            tail = self.tokenizer.decode(job.tokens[-16:], skip_special_tokens=True)
            if any(s in tail for s in job.request.stop):
                text = self.tokenizer.decode(job.tokens, skip_special_tokens=True)
                cuts = [text.find(s) for s in job.request.stop if s in text]
                job.stop_at_text = min(cuts)
                job.done, job.finish_reason = True, "stop"
        if not job.done and len(job.tokens) >= job.request.max_tokens:
            job.done, job.finish_reason = True, "length"

    def _result(self, job: _Job) -> GenerationResult:
        text = self.tokenizer.decode(job.tokens, skip_special_tokens=True)
        if job.stop_at_text is not None:
            text = text[: job.stop_at_text]
        return GenerationResult(
            token_ids=job.tokens,
            logprobs=job.logprobs,
            text=text,
            finish_reason=job.finish_reason,
            prompt_tokens=len(job.request.prompt_ids),
        )
