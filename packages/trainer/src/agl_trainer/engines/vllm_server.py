"""vLLM as an engine agl starts and stops (`agl train --engine vllm`, `agl bench ... --engine vllm`).

vLLM pins torch and transformers versions that the trainer's environment cannot share, so it runs as its OpenAI
server (`vllm serve`, started as `python -m vllm.entrypoints.cli.main serve MODEL ...`) from an environment of its
own: `make vllm` builds `.venv-vllm` (found in the current directory or a parent), `--vllm-python` or
`AGL_VLLM_PYTHON` names another one. The server is started with what agl needs from it:

- the base model folder the trainer loads, in the trainer's dtype (fp32 on a CPU: served log-probs then equal the
  trainer's to ~1e-5);
- runtime LoRA loading (`VLLM_ALLOW_RUNTIME_LORA_UPDATING`) with enough slots for two versions of every adapter
  (`publish.RemoteAdapterEngine` loads each update under a new name before the old one is dropped), or, for full
  fine-tuning, the development routes that reload the weights (`VLLM_SERVER_DEV_MODE`);
- `--logprobs-mode processed_logprobs`: the log-probs of the distribution the token was sampled from,
  log softmax(logits / T), as the trainer computes them (vLLM's default is the temperature-1 log-probs);
- `--generation-config vllm`: neutral sampling defaults, not the model's `generation_config.json` (whose top-p,
  top-k or repetition penalty would silently truncate what agl trains as softmax(logits / T)), with a default of
  `serving.DEFAULT_MAX_TOKENS` new tokens for requests that set none, as agl's own engine has;
- Hermes tool calls (`--enable-auto-tool-choice --tool-call-parser hermes`) and, for a model whose template does not
  render tools, the chat template `chat_format.engine_chat_template` builds, so that vLLM's prompt ids are exactly
  agl's own rendering (`chat_format.render_prompt`);
- on a CPU, a KV cache of `cpu_kv_cache_gib` (vLLM's default reserves 92 % of the memory node and refuses to start
  when less is free); on a GPU, `gpu_memory_utilization` of its memory (the trainer holds the policy on the same
  GPU);
- on a CPU, fewer processes (`cpu_layout`, below) and agl's vLLM plugin (`vllm_plugin/agl_vllm_cpu.py`, on the
  server's PYTHONPATH: LoRA products grouped by adapter, 2× the generation speed with an adapter served);
- with data parallelism (`data_parallel` > 1), one API server per data-parallel rank (`--api-server-count`), all on
  the one port; but a single one when LoRA adapters are loaded at run time, which vLLM 0.32 refuses with more (each
  API server keeps its own table of loaded adapters: one loaded through one server would be unknown to the others).
  The plan then runs a server per data-parallel rank instead (`split_per_gpu`: each of data parallel 1 on its own
  GPUs, port and log), which agl's proxy routes over and every weight update reaches (agl_trainer.engines.local_servers
  on one machine, agl_trainer.engines.fleet on a Ray cluster).

**The command.** `python -m vllm.entrypoints.openai.api_server` is deprecated in vLLM 0.32 and runs one API server
in front of all data-parallel engines; `vllm serve` runs `--api-server-count` of them (its default: one per rank).
Every API server registers every route, the development ones included (`VLLM_SERVER_DEV_MODE` is inherited), and
each is a client of all the engines: vLLM's data-parallel client sends the utility calls behind `/sleep`,
`/wake_up?tags=...`, `/collective_rpc`, `/reset_prefix_cache` and `/v1/load_lora_adapter` to every engine, whichever
server the request reached (`v1/engine/core_client.py`, `DPLBAsyncMPClient.call_utility_async`), and answers with
the first engine's result. On CUDA agl runs `python -m vllm.entrypoints.cli.main serve` (the `vllm` command). vLLM's
CLI asks for the version of the distribution `vllm` when it builds its parser, and vllm-cpu installs as `vllm-cpu`
(both `vllm serve` and `python -m vllm.entrypoints.cli.main` then fail with PackageNotFoundError): on a CPU the same
CLI is started by `CPU_SERVE`, a few lines that answer for `vllm` with vllm-cpu's version + "+cpu", as vLLM's own
platform check does (`vllm/platforms/__init__.py`).

**The CPU layout.** vLLM's CPU backend runs its scheduler, its model worker and its HTTP server as three processes
that poll shared memory while busy (`sched_yield` in a loop), and it reserves one core for the scheduler, pinning
the model to the rest. On a machine of a few cores that leaves the model one core and the agent, agl's server and
the trainer fighting a spinning scheduler for the other (measured on 2 cores: the scheduler at 87 % of a core,
33 % of it in system calls). agl runs the model in the engine core's process instead (`--distributed-executor-
backend uni`, which vLLM's CPU platform allows when `VLLM_ENABLE_V1_MULTIPROCESSING=0`), with OpenMP unpinned over
`cpu_threads` threads. Measured in `benchmarks/perf/bench_vllm_cpu.py`.

`AGL_VLLM_ARGS` (shell words) is appended to the command line: later flags win, so any of the above can be changed.
The server runs in its own process group, logs to `<run>/logs/vllm.log`, is waited for with a progress line
(30-150 s on a 2-core CPU), and is stopped, group and all, when the run ends, fails or is interrupted. It is never
restarted behind the user's back: if it dies, the next weight update says so and the run stops.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import httpx
from rich.console import Console

from agl.common.processes import killed_with_parent
from agl_trainer.backends import EngineError

ENV_PYTHON = "AGL_VLLM_PYTHON"
ENV_ARGS = "AGL_VLLM_ARGS"
VENV = ".venv-vllm"
SERVED_BASE = "base"  # the base model's name on the server (`embedded.BASE_MODEL`, which the proxy routes to)
# put on the CPU server's PYTHONPATH: a vLLM general plugin (its .dist-info names the entry point); no agl imports
CPU_PLUGIN_PATH = Path(__file__).parents[1] / "vllm_plugin"  # beside the package's folders, not a module of it
# put on the server's PYTHONPATH when it has a key: the middleware that asks for it on every route (no agl imports)
GATE_PATH = Path(__file__).parents[1] / "vllm_gate"
GATE_MIDDLEWARE = "agl_vllm_gate.EngineKeyGate"
GATE_KEY_ENV = "AGL_ENGINE_KEY"  # agl_vllm_gate.KEY_ENV
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # what vLLM 0.32 accepts as --max-lora-rank
VLLM_CLI = "vllm.entrypoints.cli.main"  # `vllm`: `python -m vllm.entrypoints.cli.main serve MODEL ...`
# `vllm serve` where the distribution is vllm-cpu (the module's docstring): `python -c CPU_SERVE serve MODEL ...`
CPU_SERVE = """\
import importlib.metadata as metadata
import sys


def version(name, _version=metadata.version):
    try:
        return _version(name)
    except metadata.PackageNotFoundError:
        if name != "vllm":
            raise
        return _version("vllm-cpu") + "+cpu"


metadata.version = version
sys.argv[0] = "vllm"
from vllm.entrypoints.cli.main import main

main()
"""


class VLLMNotFound(FileNotFoundError):
    """No Python environment with vLLM: the message says how to make one."""


def find_vllm_python(explicit: str | os.PathLike[str] | None = None, start: Path | None = None) -> Path:
    """The Python that runs vLLM: `explicit`, else `$AGL_VLLM_PYTHON`, else `.venv-vllm/bin/python` in `start`
    (the current directory) or one of its parents."""
    given = explicit or os.environ.get(ENV_PYTHON)
    if given:
        path = Path(given).expanduser()
        origin = "--vllm-python" if explicit else ENV_PYTHON
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise VLLMNotFound(
                f"{origin} names {path}, which is not an executable Python: point it at the python of an "
                f"environment with vLLM, or run `make vllm` in the agl checkout to build {VENV}"
            )
        return path
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / VENV / "bin" / "python"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise VLLMNotFound(
        f"no vLLM environment: {VENV}/bin/python is not in {here} or any parent folder. Run `make vllm` in the agl "
        f"checkout to create it (vllm-cpu on a machine without CUDA, vllm with CUDA), or point --vllm-python / "
        f"{ENV_PYTHON} at the python of an environment that has vLLM"
    )


def lora_rank_slot(rank: int) -> int:
    """The smallest --max-lora-rank vLLM accepts that holds an adapter of `rank`."""
    for allowed in LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"LoRA rank {rank} is above the largest vLLM serves ({LORA_RANKS[-1]})")


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class VLLMSettings:
    model: Path  # a local Hugging Face model folder (the bundled model's safetensors copy, or the user's)
    log_path: Path
    python: str | None = None  # else $AGL_VLLM_PYTHON, else .venv-vllm
    dtype: str = "float32"  # the trainer's: served log-probs then match its own
    lora_adapters: int = 0  # adapters served at once (0: no LoRA)
    lora_rank: int = 16
    full_weights_reload: bool = False  # full fine-tuning: the development routes that reload weights
    chat_template: str | None = None  # Jinja text; None: the model's own
    default_max_tokens: int = 512
    device: str = "cpu"  # where the trainer runs; vLLM runs beside it
    cpu_kv_cache_gib: float = 1.0
    cpu_layout: bool = True  # on a CPU: one process, unpinned threads, grouped LoRA products (see above)
    cpu_threads: int = 0  # OpenMP threads of the one-process layout (0: OMP_NUM_THREADS if set, else every core)
    gpu_memory_utilization: float = 0.5
    # on GPUs (agl_trainer.plan): the tool-call format of the model's family, the longest sequence served (vLLM's
    # default is the model's maximum, 131,072 for Llama 3.x, whose KV cache would not fit), parallelism, and the
    # sleep mode that frees the GPU for the update when vLLM shares it with the trainer
    tool_parser: str = "hermes"
    max_model_len: int | None = None
    tensor_parallel: int = 1
    data_parallel: int = 1
    sleep_mode: bool = False
    # the GPUs of this node vLLM may use (CUDA_VISIBLE_DEVICES); None: all. The split layout gives it the last K
    # and the trainer's local Ray the others
    gpu_ids: tuple[int, ...] | None = None
    host: str = "127.0.0.1"
    port: int = 0  # 0: a free one
    extra_args: Sequence[str] = field(default_factory=list)
    # asked on every route but /health (vllm_gate/agl_vllm_gate.py), sent by agl's clients as a bearer token; in
    # the environment, never on the command line. None: a server open to whoever reaches its port
    api_key: str | None = field(default=None, repr=False)

    @property
    def headers(self) -> dict[str, str]:
        """What agl's requests to this server carry: its key, when it has one."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def vllm_argv(s: VLLMSettings, python: str, port: int | str, template_path: Path | None) -> list[str]:
    """The command line of the vLLM server `s` describes (`template_path`: where its chat template is written):
    `vllm serve MODEL ...`, `serve` always its fourth word (`[python, "-m", VLLM_CLI, "serve", ...]` on CUDA,
    `[python, "-c", CPU_SERVE, "serve", ...]` on a CPU)."""
    on_gpu = s.device.startswith("cuda")
    cmd = [python, "-m", VLLM_CLI] if on_gpu else [python, "-c", CPU_SERVE]
    cmd += ["serve", str(s.model), "--served-model-name", SERVED_BASE]
    cmd += ["--host", s.host, "--port", str(port), "--dtype", s.dtype]
    cmd += ["--logprobs-mode", "processed_logprobs"]
    cmd += ["--generation-config", "vllm"]
    cmd += ["--override-generation-config", json.dumps({"max_new_tokens": s.default_max_tokens})]
    cmd += ["--enable-auto-tool-choice", "--tool-call-parser", s.tool_parser]
    if template_path is not None:
        cmd += ["--chat-template", str(template_path), "--chat-template-content-format", "string"]
    if s.lora_adapters:
        cmd += ["--enable-lora", "--max-lora-rank", str(lora_rank_slot(s.lora_rank))]
        cmd += ["--max-loras", str(2 * s.lora_adapters)]  # the current version of each adapter and the last
    if on_gpu:
        cmd += ["--gpu-memory-utilization", str(s.gpu_memory_utilization)]
    else:
        cmd += ["--kv-cache-memory-bytes", str(int(s.cpu_kv_cache_gib * 2**30))]
    if s.max_model_len is not None:
        cmd += ["--max-model-len", str(s.max_model_len)]
    if s.tensor_parallel > 1:
        cmd += ["--tensor-parallel-size", str(s.tensor_parallel)]
    if s.data_parallel > 1:
        cmd += ["--data-parallel-size", str(s.data_parallel), "--api-server-count", str(api_server_count(s))]
    if s.sleep_mode:
        cmd += ["--enable-sleep-mode"]
    if s.cpu_layout and not on_gpu:
        cmd += ["--distributed-executor-backend", "uni"]
    if s.api_key:
        cmd += ["--middleware", GATE_MIDDLEWARE]
    cmd += ["--disable-uvicorn-access-log"]
    return [*cmd, *s.extra_args, *shlex.split(os.environ.get(ENV_ARGS, ""))]


def api_server_count(s: VLLMSettings) -> int:
    """vLLM's API server processes: one per data-parallel rank, or one when LoRA adapters are loaded at run time
    (vLLM 0.32's `vllm serve` refuses `VLLM_ALLOW_RUNTIME_LORA_UPDATING` with more than one: each server keeps its
    own table of loaded adapters)."""
    return 1 if s.lora_adapters else max(1, s.data_parallel)


PER_GPU_WHY = (
    "LoRA adapters are loaded at run time (VLLM_ALLOW_RUNTIME_LORA_UPDATING), which vLLM 0.32 refuses with more "
    "than one API server (each would keep its own table of adapters): one server for all data-parallel ranks would "
    "put every request of the node through one API process, so each rank gets a server of its own, and agl's "
    "proxy routes over them"
)


def servers_per_node(s: VLLMSettings) -> int:
    """How many vLLM servers serve what `s` describes: one per data-parallel rank when LoRA adapters are loaded at
    run time with data parallelism (`split_per_gpu`), else one (full fine-tuning keeps one server with an API
    server per rank, `api_server_count`)."""
    return s.data_parallel if s.lora_adapters and s.data_parallel > 1 else 1


def split_per_gpu(s: VLLMSettings) -> list[VLLMSettings]:
    """The servers `s` runs as (`servers_per_node`): `s` itself, or one server per data-parallel rank, each of data
    parallel 1 on its own `tensor_parallel` GPUs of the node (`gpu_ids`: a slice of `s.gpu_ids`, else of the
    node's GPUs in order), with its own port (`s.port + i`, or a free one) and log (`vllm-gpu<first GPU>.log`)."""
    n = servers_per_node(s)
    if n == 1:
        return [s]
    tp = max(1, s.tensor_parallel)
    ids = s.gpu_ids if s.gpu_ids is not None else tuple(range(n * tp))
    if len(ids) < n * tp:
        raise ValueError(f"{n} servers of {tp} GPU(s) need {n * tp} GPUs; vLLM was given {list(ids)}")
    out = []
    for i in range(n):
        gpus = tuple(ids[i * tp : (i + 1) * tp])
        log = s.log_path.with_name(f"{s.log_path.stem}-gpu{'-'.join(map(str, gpus))}{s.log_path.suffix}")
        port = s.port + i if s.port else 0
        out.append(dataclasses.replace(s, data_parallel=1, gpu_ids=gpus, port=port, log_path=log))
    return out


def vllm_env_changes(s: VLLMSettings, cpu_threads: int | None = None) -> dict[str, str]:
    """The environment variables agl sets for the vLLM server `s` describes (the rest is inherited, less the
    trainer's PYTHONPATH, PYTHONHOME and VIRTUAL_ENV)."""
    env: dict[str, str] = {}
    if s.lora_adapters:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if s.gpu_ids is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in s.gpu_ids)
    if s.full_weights_reload or s.sleep_mode:
        # /collective_rpc (reload_weights), /reset_prefix_cache, and /sleep, /wake_up
        env["VLLM_SERVER_DEV_MODE"] = "1"
    paths = []
    if s.api_key:
        env[GATE_KEY_ENV] = s.api_key
        paths.append(str(GATE_PATH))
    if s.cpu_layout and not s.device.startswith("cuda"):
        paths.append(str(CPU_PLUGIN_PATH))
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
        env["OMP_NUM_THREADS"] = str(cpu_threads or s.cpu_threads or inherited_omp_threads() or os.cpu_count() or 1)
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def inherited_omp_threads() -> int:
    """The OMP_NUM_THREADS this process was started with (0: unset or not a count). A user who limits OpenMP's
    threads for the run limits vLLM's too: on a CPU shared with other busy processes, a thread per core spin-waits
    (`make test` runs two test processes on two cores with one thread each, and vLLM's servers beside them)."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() else 0


class VLLMServer:
    """A vLLM OpenAI server in a child process group; `url` ends in `/v1`."""

    def __init__(
        self, settings: VLLMSettings, console: Console | None = None, *, die_with_parent: bool = False
    ) -> None:
        self.settings = settings
        self.die_with_parent = die_with_parent  # started by a fleet's Ray actor: killed if the actor dies
        self.console = console or Console(stderr=True)
        self.python = find_vllm_python(settings.python)
        self.port = settings.port or _free_port(settings.host)
        self.root = f"http://{settings.host}:{self.port}"
        self.url = f"{self.root}/v1"
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None
        self._log: TextIO | None = None
        self._previous_sigterm: Any = None

    # ------------------------------------------------------------------------------------- command

    @property
    def uses_cpu_layout(self) -> bool:
        """The CPU layout: the model in the engine core's process, and agl's plugin (see the module's docstring)."""
        return self.settings.cpu_layout and not self.settings.device.startswith("cuda")

    def command(self) -> list[str]:
        s = self.settings
        template = None
        if s.chat_template is not None:
            template = s.log_path.parent / "vllm_chat_template.jinja"
            template.write_text(s.chat_template)
        return vllm_argv(s, str(self.python), self.port, template)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        for key in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):  # the trainer's, not vLLM's
            env.pop(key, None)
        env.update(vllm_env_changes(self.settings))
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("VLLM_DO_NOT_TRACK", "1")
        return env

    @property
    def headers(self) -> dict[str, str]:
        return self.settings.headers

    # ----------------------------------------------------------------------------------- lifetime

    def start(self, timeout_s: float = 900.0) -> VLLMServer:
        s = self.settings
        s.log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = self.command()
        self._log = s.log_path.open("a")
        env = self.environment()
        set_here = {k: v for k, v in env.items() if os.environ.get(k) != v}
        self._log.write(f"\n# agl: {shlex.join([f'{k}={v}' for k, v in sorted(set_here.items())] + cmd)}\n")
        self._log.flush()
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group: stop() reaches the engine core and workers too
            preexec_fn=killed_with_parent() if self.die_with_parent else None,
        )
        self._stop_on_sigterm()
        try:
            self._wait_ready(t0, timeout_s)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0
        return self

    def _wait_ready(self, t0: float, timeout_s: float) -> None:
        what = f"vLLM ({self.settings.model.name}, log {self.settings.log_path})"
        progress = self.console.status(f"starting {what}") if self.console.is_terminal else None
        last_line = t0
        if progress is not None:
            progress.start()
        else:
            self.console.print(f"starting {what}")
        try:
            with httpx.Client(timeout=5.0, headers=self.settings.headers) as http:
                while True:
                    elapsed = time.monotonic() - t0
                    if self.proc is None or self.proc.poll() is not None:
                        code = None if self.proc is None else self.proc.returncode
                        raise EngineError(
                            f"vLLM exited with code {code} after {elapsed:.0f} s while starting; the end of "
                            f"{self.settings.log_path}:\n{self.log_tail()}"
                        )
                    if elapsed > timeout_s:
                        raise EngineError(
                            f"vLLM did not answer on {self.root} within {timeout_s:.0f} s; the end of "
                            f"{self.settings.log_path}:\n{self.log_tail()}"
                        )
                    try:
                        status = http.get(f"{self.url}/models").status_code
                    except httpx.HTTPError:
                        status = None
                    if status == 200:
                        break
                    if status == 401:  # another server on the port, or the gate did not get this server's key
                        raise EngineError(
                            f"{self.url}/models refused the run's key (401); the end of "
                            f"{self.settings.log_path}:\n{self.log_tail()}"
                        )
                    if progress is not None:
                        progress.update(f"starting {what}: {elapsed:.0f} s")
                    elif time.monotonic() - last_line >= 15:
                        self.console.print(f"  vLLM starting: {elapsed:.0f} s")
                        last_line = time.monotonic()
                    time.sleep(0.5)
        finally:
            if progress is not None:
                progress.stop()
        self.console.print(f"vLLM ready in {time.monotonic() - t0:.0f} s at {self.url}")

    def check_alive(self) -> None:
        """Raise if the server has exited (it is never restarted silently)."""
        if self.proc is not None and self.proc.poll() is not None:
            raise EngineError(
                f"the vLLM server exited with code {self.proc.returncode}; the end of {self.settings.log_path}:\n"
                f"{self.log_tail()}"
            )

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.settings.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM to the whole process group, SIGKILL after `timeout_s`."""
        proc = self.proc
        if proc is not None:
            if proc.poll() is None:
                _signal_group(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    _signal_group(proc.pid, signal.SIGKILL)
                    proc.wait(10)
            _signal_group(proc.pid, signal.SIGKILL)  # workers the server left behind, if any
            _wait_group_gone(proc.pid, timeout_s=10.0)
            self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
        self._restore_sigterm()

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # A SIGTERM would end this process without running `finally` blocks and leave the server running: while it
    # runs, SIGTERM raises SystemExit instead (only when nobody else handles SIGTERM).
    def _stop_on_sigterm(self) -> None:
        import threading

        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:

            def _exit(signum: int, frame: FrameType | None) -> None:
                raise SystemExit(128 + signum)

            self._previous_sigterm = signal.signal(signal.SIGTERM, _exit)

    def _restore_sigterm(self) -> None:
        import threading

        if self._previous_sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _running_members(group: int) -> bool:
    """Whether a process of this group is still running (a zombie, dead and waiting to be reaped, is not)."""
    proc = Path("/proc")
    if not proc.is_dir():  # no procfs: any member, zombies included, counts
        try:
            os.killpg(group, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            state, _ppid, pgrp = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, IndexError, ValueError):
            continue  # the process ended while being read
        if int(pgrp) == group and state != "Z":
            return True
    return False


def _wait_group_gone(group: int, timeout_s: float) -> None:
    """SIGKILL is delivered asynchronously: a process of the group (vLLM's engine core) can still be running for
    a moment after `killpg` returns. Wait for the group to end, so that "stopped" means stopped (its memory and
    port free) when `stop` returns."""
    deadline = time.monotonic() + timeout_s
    while _running_members(group) and time.monotonic() < deadline:
        time.sleep(0.02)
