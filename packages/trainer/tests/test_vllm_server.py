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
from pathlib import Path

import pytest

from agl_trainer.backends import EngineError
from agl_trainer.vllm_server import (
    CPU_PLUGIN_PATH,
    ENV_ARGS,
    ENV_PYTHON,
    VLLMNotFound,
    VLLMServer,
    VLLMSettings,
    find_vllm_python,
    lora_rank_slot,
)


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
    assert cmd[:3] == [str(python), "-m", "vllm.entrypoints.openai.api_server"]
    for words in (
        f"--model {tmp_path / 'model'} --served-model-name base",
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
    assert "--enable-lora" not in full.command() and "--gpu-memory-utilization" in full.command()
    assert full.environment()["VLLM_SERVER_DEV_MODE"] == "1"
    # CUDA: vLLM's own layout and kernels, none of the CPU settings
    assert "--distributed-executor-backend" not in full.command()
    assert not {"VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_OMP_THREADS_BIND"} & set(full.environment())
    assert lora_rank_slot(12) == 16
    assert [lora_rank_slot(r) for r in (1, 2, 8, 16, 17, 64)] == [1, 8, 8, 16, 32, 64]


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
