"""One engine server per node, started and managed by agl through Ray (agl_trainer.engines.fleet, issue #42).

- fast: every request the trainer makes of its engine (sleep, wake, reloads, prefix-cache resets, adapter loads)
  reaches every server, against two recording stand-ins of vLLM's server; a server that died is dropped and the
  request goes on with the rest; with none left it fails;
- slow: on a two-node local Ray cluster, agl starts an `agl engine` on each node through node-pinned Ray actors,
  fans each adapter publication out to both, and `agl serve` routes over both; one server killed mid-run loses and
  duplicates no call, is reported with its node and log, leaves the proxy's rotation, and the run goes on with the
  survivor; a Ray actor killed takes its server with it; with none left, the next publication fails naming both.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from test_colocation import RecordingPolicy
from vllm_stub import RecordingVllm

from agl_trainer.backends import EngineError
from agl_trainer.engines.colocation import Colocation
from agl_trainer.engines.publish import RemoteAdapterEngine, RemoteWeightsEngine


class Servers:
    """What fan_out asks of a fleet (`urls`, `check_alive`), over stand-ins whose death the test decides."""

    def __init__(self, urls: list[str]) -> None:
        self.alive = list(urls)
        self.dead: set[str] = set()
        self.lost: list[str] = []

    def urls(self) -> list[str]:
        return list(self.alive)

    def check_alive(self) -> None:
        for url in [u for u in self.alive if u in self.dead]:
            self.alive.remove(url)
            self.lost.append(url)
        if not self.alive:
            raise EngineError(f"every engine server has stopped ({', '.join(self.lost)})")


def test_every_request_reaches_every_server_and_a_dead_one_is_dropped(tmp_path: Path) -> None:
    events: list[str] = []
    with RecordingVllm() as first, RecordingVllm() as second:
        servers = Servers([first.url, second.url])
        sharing = Colocation(first.url, RecordingPolicy(events), level=1, servers=servers)
        sharing.sleep_engine()
        sharing.give_vllm_the_gpus()
        for vllm in (first, second):
            assert vllm.calls == ["POST /sleep?level=1", "POST /wake_up?tags=weights", "POST /wake_up?tags=kv_cache"]
        adapters = RemoteAdapterEngine(first.url, RecordingPolicy(events), tmp_path / "adapters", server=servers)  # type: ignore[arg-type]
        adapters.weights_changed()
        weights = RemoteWeightsEngine(first.url, lambda p: p.mkdir(parents=True), tmp_path / "full", server=servers)
        weights.weights_changed()
        for vllm in (first, second):
            assert vllm.calls[3:] == ["POST /v1/load_lora_adapter", "POST /collective_rpc", "POST /reset_prefix_cache"]
        # the second server dies: its failure is excused once the fleet has dropped it, the first still gets it all
        second.__exit__()
        servers.dead.add(second.url)
        sharing.sleep_engine()  # sent to both: the second's failure is excused once the fleet has dropped it
        assert servers.lost == [second.url] and servers.urls() == [first.url]
        adapters.weights_changed()
        assert first.calls[-2:] == ["POST /sleep?level=1", "POST /v1/load_lora_adapter"]
        assert len(second.calls) == 6
        # a living server's failure is not excused: the first refuses (it is stopped, but the fleet thinks it alive)
        first.__exit__()
        with pytest.raises(EngineError, match=f"{first.root}: /sleep failed"):
            sharing.sleep_engine()
        servers.dead.add(first.url)
        with pytest.raises(EngineError, match="every engine server has stopped"):
            adapters.weights_changed()
        sharing.close()
        adapters.close()
        weights.close()


# ----------------------------------------------------------------------------------------- two Ray nodes


def fleet_run(address: str, model_dir: str, run_dir: str) -> None:
    """The driver's side of the test below (a process of its own, as `agl train --ray-address` is); prints JSON."""
    from functools import partial

    import httpx
    import torch
    from test_ray_placement import connected

    from agl.client import Client
    from agl.common.processes import start_server
    from agl_trainer.config import PolicyConfig
    from agl_trainer.engines.fleet import EngineFleet
    from agl_trainer.engines.remote import agl_engine_on_node
    from agl_trainer.models import load_model
    from agl_trainer.plan.cluster import from_ray
    from agl_trainer.policy.trainer import PolicyTrainer, wrap_lora

    out: dict[str, Any] = {}
    run = Path(run_dir)
    with connected(address):
        hardware = from_ray(None)
        assert hardware is not None
        out["cluster_nodes"] = list(hardware.node_ids)
        nodes = list(zip(hardware.node_ids, hardware.node_names, strict=True))
        # the split layout: each server asks Ray for one of its node's two GPUs
        launch = partial(agl_engine_on_node, model_dir, run / "logs")
        fleet = EngineFleet.start(launch, nodes, gpus_per_server=1, timeout_s=300)
        server = None
        try:
            out["urls"] = fleet.urls()
            out["members"] = [m.node for m in fleet.members]
            out["split"] = split_layout_pinned(fleet)
            model, tokenizer = load_model(Path(model_dir), device="cpu")
            torch.manual_seed(0)
            policy = PolicyTrainer(wrap_lora(model, PolicyConfig()), PolicyConfig(), pad_id=tokenizer.pad_token_id)
            engine = RemoteAdapterEngine(fleet.url, policy, run / "published", server=fleet)
            engine.weights_changed()

            def served(url: str) -> list[str]:
                return [m["id"] for m in httpx.get(f"{url}/models").json()["data"]]

            out["served_v1"] = [served(url) for url in fleet.urls()]
            (run / "admin").write_text("admin token")  # the engine routes need one, as the trainer's server has
            more = [f"--upstream={url}" for url in fleet.urls()]
            server = start_server(run / "store", extra_args=[*more, f"--admin-token-file={run / 'admin'}"])
            client = Client(server.url, token="admin token")
            fleet.on_lost.append(client.remove_engine)
            attempts = []
            for _ in range(4):
                (rollout,) = client.enqueue("x")
                (claim,) = httpx.post(f"{server.url}/api/v1/claims", json={"worker_id": "w", "lease_s": 600}).json()
                attempts.append((rollout.id, f"{server.url}/rollout/{rollout.id}/attempt/{claim['attempt']['id']}/v1"))

            def chat(base: str, text: str) -> int:
                body = {"model": "agl-policy", "max_tokens": 4, "messages": [{"role": "user", "content": text}]}
                resp = httpx.post(f"{base}/chat/completions", json=body, timeout=120)
                if resp.status_code != 200:
                    out.setdefault("errors", []).append(resp.text[:300])
                return resp.status_code

            statuses: list[int] = []
            threads = [threading.Thread(target=lambda b=b: statuses.append(chat(b, "one"))) for _, b in attempts]
            for t in threads:
                t.start()
            for t in threads:
                t.join(300)
            out["first_statuses"] = statuses
            out["engines_used"] = sorted(
                {c.engine or "" for rid, _ in attempts for c in client.rollout_detail(rid).llm_calls}
            )
            # one server dies (SIGKILL): each attempt's next call is answered (by the survivor) and stored once
            victim = fleet.members[1]
            out["victim"] = {"node": victim.node, "url": victim.url}
            os.kill(victim.pid or 0, signal.SIGKILL)
            time.sleep(1)
            out["after_kill_statuses"] = [chat(b, "two") for _, b in attempts]
            out["calls_per_attempt"] = [len(client.rollout_detail(rid).llm_calls) for rid, _ in attempts]
            out["engines_after_kill"] = [
                c.engine for rid, _ in attempts for c in client.rollout_detail(rid).llm_calls if c.seq == 1
            ]
            # the next publication finds it dead: reported with node and log, out of the proxy, v2 on the survivor
            engine.weights_changed()
            out["lost"] = list(fleet.lost)
            out["proxy_engines"] = [e["url"] for e in client.engines()]
            out["served_v2"] = [served(url) for url in fleet.urls()]
            # the survivor's Ray actor is killed: its server dies with it (no orphan), and nothing is left to serve
            survivor = fleet.members[0]
            import ray

            ray.kill(survivor.actor)
            deadline = time.monotonic() + 20
            while Path(f"/proc/{survivor.pid}").exists() and time.monotonic() < deadline:
                status = Path(f"/proc/{survivor.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                if status == "Z":
                    break
                time.sleep(0.2)
            out["survivor_server_gone"] = time.monotonic() < deadline
            try:
                engine.weights_changed()
                out["last_publication"] = "published"
            except EngineError as exc:
                out["last_publication"] = str(exc)
            client.close()
        finally:
            if server is not None:
                server.stop()
            fleet.stop()
    print(json.dumps(out))


def split_layout_pinned(fleet: Any) -> dict[str, Any]:
    """Where the trainer's ranks land beside servers that hold a GPU each: (each node's server GPU, the rank's)."""
    import ray
    from ray.util.placement_group import remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from agl_trainer.verl.placement import reserve

    @ray.remote(num_gpus=1, num_cpus=1)
    def rank() -> tuple[str, list[str]]:
        return ray.get_runtime_context().get_node_id(), [str(g) for g in ray.get_gpu_ids()]

    found: dict[str, Any] = {"servers": {}, "ranks": {}}
    for member in fleet.members:  # vLLM's GPUs: what Ray set for the server (its environment)
        environ = Path(f"/proc/{member.pid}/environ").read_bytes().split(b"\0")
        visible = [e.split(b"=", 1)[1].decode() for e in environ if e.startswith(b"CUDA_VISIBLE_DEVICES=")]
        found["servers"][member.node_id] = visible
    groups = reserve([1, 1], gpu_resource="GPU", timeout_s=60)
    for group in groups:
        node, gpus = ray.get(rank.options(scheduling_strategy=PlacementGroupSchedulingStrategy(group, 0)).remote())
        found["ranks"][node] = gpus
    for group in groups:
        remove_placement_group(group)
    try:  # two ranks on a node whose other GPU a server holds: Ray cannot place them
        reserve([2], gpu_resource="GPU", timeout_s=5)
        found["two_per_node"] = "placed"
    except RuntimeError as exc:
        found["two_per_node"] = str(exc)
    return found


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs Ray (the trainer's verl extra)")
def test_a_server_per_node_through_ray_with_fan_out_routing_and_loss(tmp_path: Path, tiny_model_dir: Path) -> None:
    from test_ray_placement import ENV, two_nodes

    with two_nodes(tmp_path) as address:
        code = (
            f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import test_engine_fleet as t; "
            f"t.fleet_run({address!r}, {str(tiny_model_dir)!r}, {str(tmp_path / 'run')!r})"
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=ENV)
        assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    # one server on each node of the cluster, each pinned there (EngineFleet.start checks Ray put it there)
    assert len(out["cluster_nodes"]) == 2 and len(set(out["urls"])) == 2 and len(out["members"]) == 2
    # split: each server runs on the GPU Ray gave it, each trainer rank on its node's other GPU, and a node's two
    # GPUs cannot both go to the trainer
    split = out["split"]
    assert sorted(split["servers"]) == sorted(split["ranks"]) == sorted(out["cluster_nodes"])
    for node, visible in split["servers"].items():
        assert len(visible) == 1 and visible[0] in ("0", "1") and len(split["ranks"][node]) == 1
        assert visible[0] not in split["ranks"][node], split
    assert "could not place the trainer's ranks" in split["two_per_node"]
    # the publication reached both
    assert all("default@v1" in names for names in out["served_v1"]), out["served_v1"]
    # the proxy routed over both, each call named with its engine
    assert out["first_statuses"] == [200] * 4, out.get("errors")
    assert sorted(out["engines_used"]) == sorted(out["urls"])
    # a server killed: every next call answered, by the survivor, each stored once
    survivor = next(u for u in out["urls"] if u != out["victim"]["url"])
    assert out["after_kill_statuses"] == [200] * 4
    assert out["calls_per_attempt"] == [2] * 4
    assert out["engines_after_kill"] == [survivor] * 4
    # reported with its node and its log's tail, out of the proxy's rotation, v2 served by the survivor alone
    assert len(out["lost"]) == 1, out["lost"]
    ((node, why),) = out["lost"]
    assert node == out["victim"]["node"] and "exited with code -9" in why and "engine-" in why
    assert out["proxy_engines"] == [survivor]
    assert len(out["served_v2"]) == 1 and "default@v2" in out["served_v2"][0]
    # an actor gone takes its server; with none left, the run's next publication stops it, naming both nodes
    assert out["survivor_server_gone"]
    assert "every engine server has stopped" in out["last_publication"]
    assert out["victim"]["node"] in out["last_publication"] and "Ray actor is lost" in out["last_publication"]
