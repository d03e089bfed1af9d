"""`agl worker AGENT --ray-address ADDR --workers N`: rollout workers placed over a Ray cluster's nodes, restarted
by Ray when they die, and stopped with the command (or with `agl train --rollout-workers N`'s run).

Each worker is an `agl worker` process as on one machine (its leases, heartbeats and `-n` rollouts at once), started
by a small Ray actor (`WorkerHost`) on the node Ray places it on: by CPU (one each), spread over the nodes, or on
nodes that declare a custom resource (`--ray-resource rollout`: `ray start --resources '{"rollout": 8}'` on the
rollout machines keeps them off the GPU nodes). The server's token reaches the process in its environment through
the actor's constructor arguments, which no command line and no dashboard field shows.

**A worker that dies** — its process, its actor, or its node — is restarted by Ray (`max_restarts`): the actor's
watcher ends the actor when its process exits unasked, Ray starts a new actor (on another node if its own is gone),
and that starts a new process. Its rollouts come back through their leases, as on one machine: an attempt whose
worker stopped heartbeating is retried once its lease runs out, and a report of a superseded attempt is discarded
by the server, so none is lost or counted twice. The command reports each restart and each worker lost for good.

**The end.** When the command is interrupted (or the run ends) every actor is stopped and killed without restart;
a process whose actor dies first gets SIGKILL from the kernel (`PR_SET_PDEATHSIG`), so no worker outlives it on any
node. Each process logs to `<log dir>/worker-<i>.<node>.log`, at the log folder's path on its node.

**The agent's code** must be importable on every node as it is here: the same path on every node (a shared folder,
or the same checkout), or `--ray-working-dir DIR`, which Ray uploads to each node and starts the workers in (its
`runtime_env`'s `working_dir`), with AGENT given relative to it. Each node runs the Python Ray runs there, with agl
installed."""

from __future__ import annotations

import faulthandler
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agl.common.processes import killed_with_parent

CHECK_EVERY_S = 5.0
# the most the command takes to stop its workers once told to: past it, it exits anyway (its actors end with this
# driver, each worker process with its actor). CI saw the command hang past 90 s on its way out, twice, beside the
# test suite; not reproduced alone
STOP_WITHIN_S = 45.0


class WorkerHost:
    """The Ray actor that runs one `agl worker` process on its node (the module's docstring)."""

    def __init__(self, index: int, argv: list[str], env: dict[str, str], log_dir: str) -> None:
        import ray

        self.node_id = ray.get_runtime_context().get_node_id()
        self.address = ray.util.get_node_ip_address()
        self.stopping = False
        log = Path(log_dir) / f"worker-{index}.{self.address}-{self.node_id[:8]}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = str(log)
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv,
                env={**os.environ, **env, "AGL_WORKER_NODE": f"{self.address}/{self.node_id[:8]}"},
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=killed_with_parent(),  # the kernel kills it with this actor
            )
        threading.Thread(target=self._watch, name="agl-worker-watch", daemon=True).start()

    def _watch(self) -> None:
        code = self.proc.wait()
        if not self.stopping and code != 0:
            os._exit(1)  # the actor ends with its process: Ray restarts it, and the new one starts a new process

    def info(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "address": self.address,
            "pid": self.proc.pid,
            "log": self.log_path,
            "exit": self.proc.poll(),
        }

    def stop(self, grace_s: float = 15.0) -> int | None:
        self.stopping = True
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


@dataclass
class RayWorkers:
    """N `WorkerHost` actors over the cluster this process joined (`ray.init` done by the caller)."""

    actors: list[Any]
    seen: list[dict[str, Any] | None]
    restarts: list[int] = field(default_factory=list)
    lost: set[int] = field(default_factory=set)
    say: Any = print
    checked_at: float = 0.0

    @classmethod
    def start(
        cls,
        argv: list[str],
        env: dict[str, str],
        *,
        workers: int,
        log_dir: Path,
        max_restarts: int = 3,
        resource: str | None = None,
        say: Any = print,
    ) -> RayWorkers:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        host = ray.remote(WorkerHost)
        options: dict[str, Any] = {
            "max_restarts": max_restarts,
            "max_task_retries": 0,
            "num_cpus": 0 if resource else 1,
        }
        if resource:
            options["resources"] = {resource: 1}
        # worker i on the i-th node (round robin) that has what it asks for: Ray's SPREAD is a preference only, and
        # with the driver's own tasks about it put two workers of two on one node. Soft: a node that is full or
        # gone (a restart) lets Ray place it elsewhere
        wanted = resource or "CPU"
        nodes = sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive") and n["Resources"].get(wanted, 0) >= 1)
        actors = [
            host.options(
                **options,
                scheduling_strategy=NodeAffinitySchedulingStrategy(nodes[i % len(nodes)], soft=True)
                if nodes
                else "SPREAD",
            ).remote(i, argv, env, str(log_dir))
            for i in range(workers)
        ]
        made = cls(actors, [None] * workers, [0] * workers, say=say)
        made.check(first=True)
        return made

    def check(self, first: bool = False) -> None:
        """Each worker's state: where it runs, a restart since the last check (said), a worker lost for good."""
        import ray

        for i, actor in enumerate(self.actors):
            if i in self.lost:
                continue
            try:
                now = ray.get(actor.info.remote(), timeout=600 if first else 60)
            except ray.exceptions.RayActorError as exc:
                self.lost.add(i)
                self.say(f"worker {i} is lost for good after {self.restarts[i]} restart(s): {type(exc).__name__}")
                continue
            except ray.exceptions.GetTimeoutError:
                continue  # being restarted (or its node is slow): the next check sees it
            before = self.seen[i]
            if before is not None and (before["pid"], before["node_id"]) != (now["pid"], now["node_id"]):
                self.restarts[i] += 1
                self.say(
                    f"worker {i} restarted (restart {self.restarts[i]}) on node {now['address']}"
                    f" ({now['node_id'][:8]}), pid {now['pid']}; its rollouts come back through their leases"
                )
            elif first:
                self.say(
                    f"worker {i} on node {now['address']} ({now['node_id'][:8]}), pid {now['pid']}, log {now['log']}"
                )
            self.seen[i] = now

    def per_node(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for i, seen in enumerate(self.seen):
            if seen is not None and i not in self.lost:
                counts[seen["node_id"]] = counts.get(seen["node_id"], 0) + 1
        return counts

    @property
    def alive(self) -> int:
        return len(self.actors) - len(self.lost)

    def all_gone(self) -> bool:
        """Whether every worker is lost for good (checked every CHECK_EVERY_S at most): what a run's wait asks."""
        if time.monotonic() - self.checked_at >= CHECK_EVERY_S:
            self.checked_at = time.monotonic()
            self.check()
        return self.alive == 0

    def stop(self) -> None:
        """Every worker stopped, its actor killed without restart: nothing left on any node."""
        import ray

        stops = []
        for actor in self.actors:
            try:
                stops.append(actor.stop.remote())
            except Exception:
                pass
        for ref in stops:
            try:
                ray.get(ref, timeout=30)
            except Exception:  # an actor already gone took its process with it (PR_SET_PDEATHSIG)
                pass
        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:
                pass


def worker_argv(agent: str, server_url: str, options: dict[str, Any]) -> list[str]:
    """The `agl worker` command each actor runs: this one's, less the Ray options (the token travels apart)."""
    argv = [sys.executable, "-m", "agl.cli.main", "worker", agent, f"--server={server_url}"]
    for flag, value in options.items():
        if value is True:
            argv.append(f"--{flag}")
        elif value not in (None, False):
            argv.append(f"--{flag}={value}")
    return argv


def worker_options_of(given: dict[str, Any], on_ray: dict[str, Any]) -> dict[str, Any]:
    """`run_on_ray`'s keyword arguments from the `agl worker` command's parameters (`given`) and its Ray options."""
    flags = {
        "concurrency": given["concurrency"],
        "processes": given["processes"],
        "max-rollouts": given["max_rollouts"],
        "idle-exit": given["idle_exit_s"],
        "lease": given["lease_s"],
        "heartbeat": given["heartbeat_s"],
        "keep-openai-env": given["keep_openai_env"],
        "log-level": given["log_level"],
    }
    return {
        "address": on_ray["ray_address"],
        "workers": on_ray["ray_workers"],
        "worker_options": flags,
        "max_restarts": on_ray["max_restarts"],
        "resource": on_ray["ray_resource"],
        "log_dir": Path(on_ray["ray_log_dir"]),
        "working_dir": on_ray["ray_working_dir"],
    }


def run_on_ray(
    agent: str,
    server_url: str,
    token: str | None,
    *,
    address: str,
    workers: int,
    worker_options: dict[str, Any],
    max_restarts: int,
    resource: str | None,
    log_dir: Path,
    working_dir: str | None,
) -> int:
    """Start the workers, report on them every few seconds until interrupted or all are lost, then stop them all.
    The exit code: 0 when interrupted with workers alive, 1 when every worker was lost."""
    import signal

    import ray

    def interrupted(signum: int, frame: Any) -> None:
        _exit_within(STOP_WITHIN_S, 0)  # whatever hangs on the way out, the command ends
        # and should Python itself be stuck (a call that holds the interpreter lock), faulthandler's watchdog, a C
        # thread, prints every thread's stack, which says where, and ends it a little later
        faulthandler.dump_traceback_later(STOP_WITHIN_S + 10, exit=True)
        raise KeyboardInterrupt  # SIGTERM stops the workers as Ctrl-C does

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)
    runtime_env = {"working_dir": working_dir} if working_dir else None
    ray.init(address=address, runtime_env=runtime_env, log_to_driver=False, configure_logging=False)
    env = {"AGL_TOKEN": token} if token else {}  # in the process's environment, never on a command line
    say = _say
    pool = RayWorkers.start(
        worker_argv(agent, server_url, worker_options),
        env,
        workers=workers,
        log_dir=log_dir.resolve(),
        max_restarts=max_restarts,
        resource=resource,
        say=say,
    )
    nodes = pool.per_node()
    say(f"{pool.alive} worker(s) on {len(nodes)} node(s): " + ", ".join(f"{n[:8]} × {c}" for n, c in nodes.items()))
    try:
        while pool.alive:
            time.sleep(CHECK_EVERY_S)
            pool.check()
        say("every worker was lost for good")
        _exit_within(STOP_WITHIN_S, 1)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        pool.stop()
        ray.shutdown()


def _exit_within(seconds: float, code: int) -> None:
    """End this process with `code` in `seconds` unless it has ended by then (a daemon timer: it never delays an
    exit)."""

    def now() -> None:
        _say(f"the workers did not stop within {seconds:.0f} s: exiting; their actors end with this command")
        sys.stderr.flush()
        os._exit(code)

    timer = threading.Timer(seconds, now)
    timer.daemon = True
    timer.start()


def _say(line: str) -> None:
    print(f"agl worker: {line}", file=sys.stderr, flush=True)
