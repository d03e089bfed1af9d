"""`agl worker --ray-address ADDR --workers N` on a local Ray cluster of two nodes (two `ray start` processes, as
the several-nodes tests use): workers on both nodes, their rollouts through a real `agl serve`; one worker's actor
killed mid-run, Ray restarts it, its rollouts come back through their leases, none lost or counted twice; the
command's end leaves no worker process on either node; the token in no command line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# the same two-node cluster helpers (they skip this module where Ray or verl is missing)
from test_ray_placement import ENV, connected, two_nodes

from agl.client import Client
from agl.common.processes import ServerProcess, start_server
from agl.testing.ray_cluster import command_lines

pytestmark = pytest.mark.slow
AGENT = str(Path(__file__).with_name("ray_rollout_agent.py")) + ":slow"
TOKEN = "operator-token-of-the-ray-test"


def processes(marker: str) -> list[tuple[int, str]]:
    """(pid, command line) of every live process (but this one) whose command line holds `marker`."""
    return [(pid, text) for pid, text in command_lines() if marker in text and pid != os.getpid()]


def worker_processes() -> list[tuple[int, str]]:
    return [(pid, cmd) for pid, cmd in processes("agl.cli.main worker") if "--ray-address" not in cmd]


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.fixture
def token_server(tmp_path: Path, agl_upstream: str) -> ServerProcess:
    server = start_server(tmp_path / "run", upstream=agl_upstream, token=TOKEN)
    yield server  # type: ignore[misc]
    server.stop()


def test_workers_over_two_nodes_survive_a_killed_worker_and_leave_nothing(
    tmp_path: Path, token_server: ServerProcess
) -> None:
    with two_nodes(tmp_path, gpus=0, cpus=2) as address:
        with connected(address):
            pass
        import ray

        if ray.is_initialized():
            ray.shutdown()
        with Client(token_server.url, token=TOKEN) as client:
            ids = [client.enqueue({"n": i})[0].id for i in range(24)]
        log_dir = tmp_path / "worker-logs"
        command = [
            sys.executable, "-m", "agl.cli.main", "worker", AGENT, f"--server={token_server.url}",
            f"--ray-address={address}", "--workers=2", "-n", "2", "--lease=6", "--heartbeat=1",
            f"--log-dir={log_dir}",
        ]  # fmt: skip
        out = (tmp_path / "command.log").open("wb")
        proc = subprocess.Popen(command, env={**ENV, "AGL_TOKEN": TOKEN}, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 180
            while len(worker_processes()) < 2 or "worker(s) on" not in (tmp_path / "command.log").read_text():
                assert proc.poll() is None, (tmp_path / "command.log").read_text()[-3000:]
                assert time.monotonic() < deadline, (tmp_path / "command.log").read_text()[-3000:]
                time.sleep(1)
            workers = worker_processes()
            assert all(TOKEN not in cmd for _, cmd in workers)  # the token travels in the environment only
            said = (tmp_path / "command.log").read_text()
            assert "2 worker(s) on 2 node(s)" in said, said
            with Client(token_server.url, token=TOKEN) as client:
                while sum(r.status.value == "succeeded" for r in client.list_rollouts(limit=100)[0]) < 4:
                    assert time.monotonic() < deadline
                    time.sleep(0.5)
            # kill the first worker's actor (its process goes with it: PR_SET_PDEATHSIG)
            victim, _ = workers[0]
            os.kill(parent_of(victim), signal.SIGKILL)
            with Client(token_server.url, token=TOKEN) as client:
                finished = client.wait(ids, timeout=240)
                details = [client.rollout_detail(i) for i in ids]
            said = (tmp_path / "command.log").read_text()
            assert "restarted (restart 1)" in said, said
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(90)
        assert all(r.status.value == "succeeded" for r in finished), [r.status.value for r in finished]
        for detail in details:
            final = [c for c in detail.llm_calls if c.attempt_id == detail.rollout.final_attempt_id]
            assert len(final) == 1  # the final attempt's one call: none lost, none twice
            assert detail.rollout.final_reward == 1.0
        assert any(len(d.attempts) > 1 for d in details)  # the killed worker's rollouts were retried
        time.sleep(2)
        assert worker_processes() == [], worker_processes()  # nothing left on either node
        logs = sorted(p.name for p in log_dir.iterdir())
        assert len({name.split(".", 1)[1] for name in logs}) >= 2, logs  # logs of workers on both nodes
        # the dashboard's overview counts each node's workers and their attempts
        from agl.server.dashboard.queries import overview
        from agl.store import Store

        with Store(token_server.run_dir) as store:
            nodes = overview(store.path)["workers_by_node"]
        assert len(nodes) == 2 and sum(n["finished"] for n in nodes) == 24, nodes
        assert sum(n["workers"] for n in nodes) >= 3 and sum(n["failed"] for n in nodes) >= 1  # the restarted one


def train_on(address: str, model_dir: str, run_dir: str) -> None:
    """One step of `agl train --ray-address ADDR --rollout-workers 2`, in a driver process of its own (a process that
    ran a local Ray before has its actors on a joined cluster cancelled: test_ray_placement says so)."""
    from agl_trainer.policy.trainer import PolicyConfig
    from agl_trainer.run.loop import TrainConfig, TrainingRun

    config = TrainConfig(
        agent=AGENT,
        train_tasks=[f"task {i}" for i in range(4)],
        eval_tasks=["e1"],
        run_dir=Path(run_dir),
        model=model_dir,
        device="cpu",
        steps=1,
        tasks_per_step=2,
        group_size=4,
        eval_every=5,
        concurrency=2,
        ray_address=address,
        rollout_workers=2,
        policy=PolicyConfig(lr=1e-2),
        rollout_timeout_s=120,
    )
    print(TrainingRun(config).run().steps)


def test_a_training_run_starts_its_rollout_workers_on_the_cluster(tmp_path: Path) -> None:
    """`agl train --ray-address ADDR --rollout-workers 2`: the run's server listens on this node's address with an
    operator token, its workers are spread over both nodes, the step trains on their rollouts, and the run's end
    leaves no worker process."""
    from agl.store import Store
    from agl_trainer.models import build_tiny_llama

    model = build_tiny_llama(tmp_path / "tiny")
    run_dir = tmp_path / "run"
    with two_nodes(tmp_path, gpus=0, cpus=2) as address:
        with connected(address):  # both nodes joined before the run places its workers
            pass
        import ray

        if ray.is_initialized():
            ray.shutdown()
        code = (
            f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import test_ray_workers as t; "
            f"t.train_on({address!r}, {str(model)!r}, {str(run_dir)!r})"
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=ENV)
        assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "1"
    with Store(run_dir) as store:
        rollouts, _ = store.list_rollouts(limit=100)
    assert sum(r.status.value == "succeeded" and r.mode == "train" for r in rollouts) == 8
    logs = sorted(p.name for p in (run_dir / "logs").glob("worker-*.*.log"))
    assert len(logs) == 2 and len({name.split(".", 1)[1] for name in logs}) == 2, logs  # one worker per node
    assert (run_dir / ".token").stat().st_mode & 0o777 == 0o600
    assert worker_processes() == []
