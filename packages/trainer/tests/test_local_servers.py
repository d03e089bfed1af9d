"""A vLLM server per GPU where LoRA needs it (issue #54): vLLM 0.32 refuses more than one API server with runtime
LoRA, so the plan runs a server per data-parallel rank on a node, and the run sees them as one group
(agl_trainer.engines.local_servers).

- the plan of one node of 8 GPUs: LoRA → 8 servers of data parallel 1, one GPU each, no --api-server-count; full
  fine-tuning → one server of data parallel 8 with 8 API servers; the split layout's servers on its own GPUs;
- the group starts its servers at once (stand-ins of vLLM's python: each on its GPU, port and log), stops them all
  when one fails to start, naming it;
- with `agl engine` in place of vLLM: every adapter publication reaches every server, `agl serve --upstream` once
  per server routes over all, and a server that dies is dropped from both.
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from test_plan import EIGHT, config, flag
from test_vllm_server import alive, executable

from agl_trainer.backends import EngineError
from agl_trainer.engines.local_servers import LocalServers, vllm_servers_here
from agl_trainer.engines.vllm_server import VLLMSettings, servers_per_node, split_per_gpu
from agl_trainer.plan.build import PlanRequest, make_plan

# ------------------------------------------------------------------------------------------------ the plan


def test_lora_on_eight_gpus_plans_a_server_per_gpu_and_full_fine_tuning_one_server(tmp_path: Path) -> None:
    lora = make_plan(
        PlanRequest(config("Qwen2.5-1.5B-Instruct", tmp_path, trainer_workers=8), EIGHT, flash_attention=True)
    )
    assert lora["fits"] and lora["placement"]["mode"] == "colocated"
    assert lora["placement"]["vllm"]["servers_per_node"] == 8
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" in lora["placement"]["vllm"]["servers_why"]
    servers = lora["vllm"]
    assert [(s["node"], s["server"], s["gpus"], s["gpu_ids"]) for s in servers] == [(0, i, 1, [i]) for i in range(8)]
    for i, server in enumerate(servers):
        argv, env = server["argv"], server["env"]
        assert "--data-parallel-size" not in argv and "--api-server-count" not in argv
        assert flag(argv, "--tensor-parallel-size") is None and flag(argv, "--port") == "<free port>"
        assert env["CUDA_VISIBLE_DEVICES"] == str(i) and env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
        assert "--enable-lora" in argv and "--enable-sleep-mode" in argv  # colocated: each sleeps on its GPU
        assert float(flag(argv, "--gpu-memory-utilization") or 0) == pytest.approx(0.85)
    full = make_plan(
        PlanRequest(
            config("Qwen2.5-1.5B-Instruct", tmp_path, trainer_workers=8, full_finetune=True),
            EIGHT,
            flash_attention=True,
        )
    )
    assert full["fits"] and full["placement"]["vllm"]["servers_per_node"] == 1
    assert "servers_why" not in full["placement"]["vllm"]
    (server,) = full["vllm"]
    assert flag(server["argv"], "--data-parallel-size") == "8" and flag(server["argv"], "--api-server-count") == "8"
    assert server["gpu_ids"] is None and "CUDA_VISIBLE_DEVICES" not in server["env"]


def test_the_split_layout_gives_each_servers_gpus_of_vllms_own(tmp_path: Path) -> None:
    p = make_plan(
        PlanRequest(
            config("Qwen2.5-7B-Instruct", tmp_path, trainer_workers=6), EIGHT, rollout_gpus=2, flash_attention=True
        )
    )
    assert p["placement"]["mode"] == "split" and p["placement"]["vllm"]["servers_per_node"] == 2
    assert [s["env"]["CUDA_VISIBLE_DEVICES"] for s in p["vllm"]] == ["6", "7"]  # the trainer's Ray has 0-5
    assert all("--enable-sleep-mode" not in s["argv"] for s in p["vllm"])


def test_split_per_gpu_slices_the_gpus_by_tensor_parallel(tmp_path: Path) -> None:
    base = VLLMSettings(model=tmp_path, log_path=tmp_path / "logs" / "vllm.log", device="cuda", lora_adapters=1)
    assert split_per_gpu(base) == [base] and servers_per_node(base) == 1
    one = VLLMSettings(model=tmp_path, log_path=tmp_path / "v.log", device="cuda", data_parallel=4)  # no LoRA
    assert split_per_gpu(one) == [one]
    tp2 = VLLMSettings(
        model=tmp_path,
        log_path=tmp_path / "logs" / "vllm.log",
        device="cuda",
        lora_adapters=1,
        tensor_parallel=2,
        data_parallel=3,
        gpu_ids=(2, 3, 4, 5, 6, 7),
        port=8000,
        api_key="k",
    )
    each = split_per_gpu(tp2)
    assert [(s.gpu_ids, s.port, s.data_parallel, s.tensor_parallel) for s in each] == [
        ((2, 3), 8000, 1, 2),
        ((4, 5), 8001, 1, 2),
        ((6, 7), 8002, 1, 2),
    ]
    assert [s.log_path.name for s in each] == ["vllm-gpu2-3.log", "vllm-gpu4-5.log", "vllm-gpu6-7.log"]
    assert {s.api_key for s in each} == {"k"}  # one key for the run's servers
    with pytest.raises(ValueError, match="need 6 GPUs"):
        split_per_gpu(
            VLLMSettings(
                model=tmp_path,
                log_path=tmp_path / "v.log",
                lora_adapters=1,
                tensor_parallel=2,
                data_parallel=3,
                gpu_ids=(0, 1),
            )
        )


# ------------------------------------------------------------------------- starting and stopping the group

# vLLM's python, as the group starts it: serves /v1/models on its port; refuses to start on FAKE_FAIL_GPU
FAKE_VLLM = """
import http.server, os, sys, time
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
print("fake vLLM on GPU", os.environ.get("CUDA_VISIBLE_DEVICES"), flush=True)
if os.environ.get("CUDA_VISIBLE_DEVICES") == os.environ.get("FAKE_FAIL_GPU"):
    time.sleep(0.5)
    print("RuntimeError: CUDA out of memory on this GPU", flush=True)
    sys.exit(3)
time.sleep(0.5)

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.end_headers()
        self.wfile.write(b'{"data": []}')
    def log_message(self, *a):
        pass

http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def per_gpu_settings(tmp_path: Path, gpus: int) -> list[VLLMSettings]:
    script = tmp_path / "fake_vllm.py"
    script.write_text(textwrap.dedent(FAKE_VLLM))
    python = executable(tmp_path / "bin" / "python", f'#!/bin/sh\nexec "{sys.executable}" "{script}" "$@"\n')
    node = VLLMSettings(
        model=tmp_path,
        log_path=tmp_path / "logs" / "vllm.log",
        python=str(python),
        lora_adapters=1,
        data_parallel=gpus,
        api_key="the run's key",
    )
    return split_per_gpu(node)


def environ(pid: int) -> dict[str, str]:
    pairs = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(p.decode().split("=", 1) for p in pairs if b"=" in p)


def test_the_group_starts_every_server_on_its_gpu_and_stops_them_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FAKE_FAIL_GPU", raising=False)
    group = vllm_servers_here(per_gpu_settings(tmp_path, 3))
    try:
        assert isinstance(group, LocalServers) and len(group.urls()) == len(set(group.urls())) == 3
        assert group.url == group.urls()[0] and group.headers == {"Authorization": "Bearer the run's key"}
        pids = [m.pid for m in group.members]
        assert all(p is not None and alive(p) for p in pids)
        assert [environ(p or 0)["CUDA_VISIBLE_DEVICES"] for p in pids] == ["0", "1", "2"]
        assert all(environ(p or 0)["AGL_ENGINE_KEY"] == "the run's key" for p in pids)
        for i in range(3):
            assert f"fake vLLM on GPU {i}" in (tmp_path / "logs" / f"vllm-gpu{i}.log").read_text()
        assert "3 engine servers on this machine (GPU 0: http://127.0.0.1:" in group.describe()
        # one dies: reported, dropped, and the others serve on
        lost: list[str] = []
        group.on_lost.append(lost.append)
        victim = group.members[1]
        os.kill(victim.pid or 0, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while victim.actor.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        group.check_alive()
        assert lost == [victim.url] and len(group.urls()) == 2 and group.lost[0][0] == "GPU 1"
    finally:
        group.stop()
    assert not any(alive(p or 0) for p in pids)


def test_a_server_that_fails_to_start_stops_the_others_and_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_FAIL_GPU", "1")
    settings = per_gpu_settings(tmp_path, 3)
    started: list[Any] = []
    from agl_trainer.engines import vllm_server

    real_start = vllm_server.VLLMServer.start

    def start(self: Any, timeout_s: float = 60.0) -> Any:
        started.append(self)
        return real_start(self, timeout_s)

    monkeypatch.setattr(vllm_server.VLLMServer, "start", start)
    with pytest.raises(EngineError, match=r"(?s)1 of 3 engine server\(s\) did not start: GPU 1: .*CUDA out of memory"):
        vllm_servers_here(settings)
    assert len(started) == 3 and all(s.proc is None for s in started)  # the two that started are stopped


# ------------------------------------------------------------------- fan-out and the proxy, with agl engine


@pytest.mark.slow
def test_publications_reach_every_local_server_and_the_proxy_routes_over_all(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    import httpx
    import torch

    from agl.client import Client
    from agl.common.processes import start_server
    from agl_trainer.config import PolicyConfig
    from agl_trainer.engines.publish import RemoteAdapterEngine
    from agl_trainer.engines.remote import AglEngineProcess
    from agl_trainer.models import load_model
    from agl_trainer.policy.trainer import PolicyTrainer, wrap_lora

    engines = [(f"GPU {i}", AglEngineProcess(tiny_model_dir, log_path=tmp_path / f"engine-{i}.log")) for i in range(2)]
    group = LocalServers.start_all(engines)
    server = None
    try:
        model, tokenizer = load_model(tiny_model_dir, device="cpu")
        torch.manual_seed(0)
        policy = PolicyTrainer(wrap_lora(model, PolicyConfig()), PolicyConfig(), pad_id=tokenizer.pad_token_id)
        engine = RemoteAdapterEngine(group.url, policy, tmp_path / "published", server=group)
        engine.weights_changed()

        def served(url: str) -> list[str]:
            return [m["id"] for m in httpx.get(f"{url}/models").json()["data"]]

        assert all("default@v1" in served(url) for url in group.urls())
        (tmp_path / "admin").write_text("admin token")
        more = [f"--upstream={url}" for url in group.urls()]  # as the run gives them (agl_trainer.run.loop)
        server = start_server(tmp_path / "store", extra_args=[*more, f"--admin-token-file={tmp_path / 'admin'}"])
        client = Client(server.url, token="admin token")
        group.on_lost.append(client.remove_engine)
        attempts = []
        for _ in range(4):
            (rollout,) = client.enqueue("x")
            (claim,) = httpx.post(f"{server.url}/api/v1/claims", json={"worker_id": "w", "lease_s": 600}).json()
            attempts.append((rollout.id, f"{server.url}/rollout/{rollout.id}/attempt/{claim['attempt']['id']}/v1"))

        def chat(base: str) -> int:
            body = {"model": "agl-policy", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
            return httpx.post(f"{base}/chat/completions", json=body, timeout=120).status_code

        statuses: list[int] = []
        threads = [threading.Thread(target=lambda b=b: statuses.append(chat(b))) for _, b in attempts]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert statuses == [200] * 4
        used = {c.engine for rid, _ in attempts for c in client.rollout_detail(rid).llm_calls}
        assert used == set(group.urls())
        # one dies: the next publication drops it from the group and from the proxy, and v2 reaches the other
        victim, survivor = group.members
        os.kill(victim.pid or 0, signal.SIGKILL)
        time.sleep(0.5)
        engine.weights_changed()
        assert [e["url"] for e in client.engines()] == [survivor.url] and group.urls() == [survivor.url]
        assert "default@v2" in served(survivor.url)
        assert [chat(b) for _, b in attempts] == [200] * 4
        client.close()
        engine.close()
    finally:
        if server is not None:
            server.stop()
        group.stop()


# ------------------------------------------------------------------------------------------ a Ray cluster


def test_on_a_cluster_each_node_runs_a_server_per_gpu_with_lora(tmp_path: Path) -> None:
    """What `start_fleet` asks of Ray: per node, a server per data-parallel rank (colocated: each on its GPU slice
    of the node, its actor asking Ray for none; split: each asking Ray for its GPUs), or one for full fine-tuning."""
    import dataclasses

    from agl_trainer.plan.build import plan_run, vllm_settings
    from agl_trainer.plan.hardware import Hardware
    from agl_trainer.run.setup import fleet_slots

    two = Hardware(4, 2, 80.0, node_names=("a (node 1)", "b (node 2)"), node_ids=("id-a", "id-b"))
    cluster = {"ray_address": "auto", "checkpoint_dir": str(tmp_path / "shared")}

    def slots(rollout_gpus: int | None = None, **options: Any) -> tuple[list[tuple[str, str, Any]], int]:
        req = PlanRequest(
            config("Qwen2.5-1.5B-Instruct", tmp_path, **cluster, **options), two, rollout_gpus, flash_attention=True
        )
        _, run = plan_run(req)
        settings = vllm_settings(req, run.path, run.shape, run.layout, run.longest, "python", None)
        return fleet_slots(dataclasses.replace(settings, api_key="k"), run, two)

    colocated, gpus = slots(trainer_workers=8)
    assert gpus == 0 and len(colocated) == 8
    assert [(n, s.gpu_ids, s.data_parallel) for n, _, s in colocated] == [
        (node, (i,), 1) for node in ("id-a", "id-b") for i in range(4)
    ]
    assert colocated[5][1] == "b (node 2) server 1" and {s.api_key for _, _, s in colocated} == {"k"}
    split, gpus = slots(rollout_gpus=2, trainer_workers=4)
    assert gpus == 1 and [(n, s.gpu_ids) for n, _, s in split] == [(n, None) for n in ("id-a", "id-a", "id-b", "id-b")]
    full, gpus = slots(trainer_workers=8, full_finetune=True)
    assert gpus == 0 and [(n, s.gpu_ids, s.data_parallel) for n, _, s in full] == [("id-a", None, 4), ("id-b", None, 4)]
