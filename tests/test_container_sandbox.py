"""The container sandbox (`Sandbox(kind="container", image=...)`, agl.capture.sandbox.container): the runtime's
command line it builds, the refusal when no runtime answers, and a real run under podman (with runc: crun refuses this
machine's hybrid cgroups) in an image made from this machine's own Python (tests/container_image.py): the command in
its workspace with no network but its relays, its writes confined, a process limit enforced and recorded, what it
left behind killed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import agl
from agl.capture.sandbox import container
from agl.capture.sandbox.container import ContainerLaunch, runtime_for
from tests.container_image import build

RUNTIME = os.environ.get("AGL_TEST_CONTAINER_RUNTIME", "podman --runtime runc")


def test_the_command_line_confines_as_bubblewrap_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(container, "runtime_for", lambda chosen: (["podman"], ""))
    ws, home, data = tmp_path / "ws", tmp_path / "home", tmp_path / "data"
    for folder in (ws, home, data):
        folder.mkdir()
    limits = agl.Limits(processes=40, memory_mb=300, open_files=64, cpu_s=30, disk_mb=10, tmp_mb=8)
    box = agl.Sandbox(kind="container", image="example/image:1", read_only=[data], limits=limits)
    with ContainerLaunch(["pytest", "-q"], sandbox=box, cwd=ws, home=home, env={"EXTRA": "1"}) as launch:
        launch._popen_kwargs = {}
        argv = launch.container_command(launch.environment(), str(tmp_path / "status"))
    joined = " ".join(argv)
    for flag in (
        "--network none", "--read-only", "--cap-drop ALL", "--security-opt no-new-privileges",
        "--pids-limit 72", "--memory 364m", "--memory-swap 364m", "--ulimit nofile=64:64", "--ulimit cpu=30:31",
        f"--ulimit fsize={10 * 2**20}:{10 * 2**20}", "--tmpfs /tmp:rw,size=8m,mode=1777",
        f"--volume {data}:{data}:ro", f"--volume {ws}:{ws}:rw", f"--volume {home}:{home}:rw",
        f"--workdir {ws}", f"--user {os.getuid()}:{os.getgid()}", "--env EXTRA=1", f"--env HOME={home}",
    ):  # fmt: skip
        assert flag in joined, flag
    assert argv[argv.index("example/image:1") + 1 : argv.index("example/image:1") + 4] == ["python3", "-I", "-S"]
    assert not any(a.startswith("--volume /root") or a.startswith(f"--volume {Path.home()}:") for a in argv)


def test_no_runtime_is_a_clear_refusal(tmp_path: Path) -> None:
    box = agl.Sandbox(kind="container", image="x", runtime="no-such-runtime-7")
    with pytest.raises(agl.SandboxUnavailable, match=r"no container runtime answers.*no-such-runtime-7: not installed"):
        agl.run_sandboxed(["true"], cwd=tmp_path, sandbox=box)


@pytest.mark.slow
def test_a_real_container_runs_confined(tmp_path: Path) -> None:
    runtime, why = runtime_for(RUNTIME)
    assert runtime is not None, f"{RUNTIME} does not answer ({why}): `make sandbox` installs podman and runc"
    image = build(runtime)
    ws = tmp_path / "ws"
    ws.mkdir()
    script = (
        "import os, socket\n"
        "open('made-inside.txt', 'w').write('ok')\n"
        "for target in ('/etc/planted', '/usr/planted', '/planted'):\n"
        "    try:\n"
        "        open(target, 'w').write('x'); print('wrote', target)\n"
        "    except OSError as exc:\n"
        "        print('refused', target, exc.errno)\n"
        "try:\n"
        "    socket.create_connection(('1.1.1.1', 80), 2); print('network reached')\n"
        "except OSError:\n"
        "    print('no network')\n"
        "if os.fork() == 0:\n"
        "    os.setsid(); import time; time.sleep(600)\n"
    )
    box = agl.Sandbox(kind="container", image=image, runtime=RUNTIME)
    done = agl.run_sandboxed(["python3", "-c", script], cwd=ws, timeout_s=120, sandbox=box)
    out = done.stdout.decode()
    assert done.returncode == 0, (out, done.stderr.decode())
    assert (ws / "made-inside.txt").read_text() == "ok"
    assert "wrote" not in out and out.count("refused") == 3 and "no network" in out
    assert done.left_behind == 1  # the sleeping child, killed with the container

    bomb = "import os, time\nwhile True:\n    try:\n        os.fork() or time.sleep(60)\n    except OSError:\n        time.sleep(0.05)\n"
    limited = agl.Sandbox(kind="container", image=image, runtime=RUNTIME, limits=agl.Limits(processes=16))
    bombed = agl.run_sandboxed(["python3", "-c", bomb], cwd=ws, timeout_s=60, sandbox=limited)
    assert bombed.returncode is None and any("processes" in b for b in bombed.breaches), bombed


@pytest.mark.slow
def test_a_container_reaches_its_attempt_s_llm_routes_and_nothing_else(tmp_path: Path, agl_server: Any) -> None:
    runtime, why = runtime_for(RUNTIME)
    assert runtime is not None, f"{RUNTIME} does not answer ({why}): `make sandbox` installs podman and runc"
    image = build(runtime)
    llm = agl.LLM(base_url=f"{agl_server.url}/rollout/ro-x/attempt/at-x/v1", model="m")
    script = (
        "import os, urllib.request, urllib.error\n"
        "base = os.environ['OPENAI_BASE_URL']\n"
        "opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))\n"
        "for url in (base + '/models', base.split('/rollout/')[0] + '/api/v1/rollouts'):\n"
        "    try:\n"
        "        print(opener.open(url, timeout=10).status, url)\n"
        "    except urllib.error.HTTPError as exc:\n"
        "        print(exc.code, url)\n"
    )
    box = agl.Sandbox(kind="container", image=image, runtime=RUNTIME)
    done = agl.run_cli(["python3", "-c", script], llm=llm, cwd=tmp_path, timeout_s=120, sandbox=box)
    assert done.returncode == 0 and done.sandbox == "container", done.output_tail
    assert "200 http" in done.output_tail and "/v1/models" in done.output_tail  # its attempt's route, relayed
    assert "403 http" in done.output_tail and "/api/v1/rollouts" in done.output_tail  # the REST API: refused
