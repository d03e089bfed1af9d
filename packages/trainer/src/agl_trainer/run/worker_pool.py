"""The run's rollout workers: `workers` processes on this machine, or, with `rollout_workers` and a Ray cluster,
that many spread over the cluster's nodes (agl.capture.ray_workers), restarted by Ray and stopped with the run.

Workers on other nodes must reach the run's server: it then listens on this node's address, with an operator token
made for the run (`<run>/.token`, 0600), which the workers get in their environment, never on a command line."""

from __future__ import annotations

import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from rich.console import Console

from agl.common.processes import start_worker, stop_processes
from agl_trainer.config import TrainConfig


class WorkerPool(Protocol):
    """What a run asks of its workers wherever they run (`LocalWorkers`, agl.capture.ray_workers.RayWorkers)."""

    def all_gone(self) -> bool:
        """Whether no worker is left for good: the run's wait gives up then."""
        ...

    def stop(self) -> None:
        """Every worker stopped, nothing of them left running."""
        ...


@dataclass
class LocalWorkers:
    """`agl worker` processes on this machine."""

    procs: list[subprocess.Popen[bytes]]

    def all_gone(self) -> bool:
        return all(proc.poll() is not None for proc in self.procs)

    def stop(self) -> None:
        stop_processes(self.procs)


def write_secret(path: Path) -> str:
    """A new token in `path`, readable by this user only."""
    token = secrets.token_urlsafe(32)
    path.touch(mode=0o600)
    path.chmod(0o600)  # a file left by an earlier run keeps its mode otherwise
    path.write_text(token)
    return token


def cluster_host(config: TrainConfig) -> str | None:
    """With rollout workers on Ray: this node's address, where the run's server listens (joining the cluster if
    the run has not yet, as verl's runs have). None: the workers run here, the server on loopback."""
    if not config.rollout_workers:
        return None
    import ray

    if not ray.is_initialized():
        ray.init(address=config.ray_address, log_to_driver=False, configure_logging=False)
    return str(ray.util.get_node_ip_address())


def start_rollout_workers(
    config: TrainConfig, server_url: str, token: str | None, logs: Path, console: Console
) -> WorkerPool:
    """The run's workers (the module's docstring): local processes, or the Ray workers' pool."""
    if config.rollout_workers:
        from agl.capture.ray_workers import RayWorkers, worker_argv

        argv = worker_argv(config.agent, server_url, {"concurrency": config.concurrency})
        return RayWorkers.start(
            argv,
            {"AGL_TOKEN": token} if token else {},
            workers=config.rollout_workers,
            log_dir=logs,
            say=lambda line: console.print(f"  rollout workers: {line}", style="dim"),
        )
    return LocalWorkers(
        [
            start_worker(config.agent, server_url, concurrency=config.concurrency, log_path=logs / f"worker-{i}.log")
            for i in range(config.workers)
        ]
    )
