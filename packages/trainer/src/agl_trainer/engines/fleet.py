"""One engine server per GPU node of a Ray cluster, started and managed by agl (`agl train --engine vllm
--ray-address ...` on several nodes).

**Start.** For each GPU node the plan counts (`Hardware.node_ids`, read off the cluster), agl creates a small Ray
actor pinned to that node (`NodeAffinitySchedulingStrategy(soft=False)`: it runs there or not at all), which starts
the node's server as a child process with the plan's command line and environment (`vllm_server.VLLMServer`,
listening on the node's address) and keeps it. The actors start their servers at once; the run waits for all of
them, and if one fails to start, it stops them all and says which node failed, with its log's tail: a run does not
begin on part of its cluster.

**GPUs.** Colocated, vLLM shares every GPU of its node with the trainer's ranks: its actor asks Ray for no GPU
(the trainer's placement groups hold them) and keeps the node's `CUDA_VISIBLE_DEVICES` as the node's Ray was
started with (Ray 2.60 leaves it alone for an actor of no GPU unless `RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO` is set:
`ray/_private/utils.py`, `set_visible_accelerator_ids`; agl sets it to 0 for these actors, in case that default
changes). Split (`--rollout-gpus K`), the actor asks Ray for K GPUs of its node and vLLM runs on exactly those
(Ray sets `CUDA_VISIBLE_DEVICES` to them): the trainer's ranks, placed after, cannot be given them. That is the
split layout pinned by Ray's own accounting, on any cluster.

**Requests.** Sleep, wake, adapter loads and unloads, weight reloads, prefix-cache resets and the log-prob checks
go to every server (agl_trainer.engines.fan_out); the proxy routes agents' calls over all of them (`agl serve --upstream`
once per server).

**A server that dies** is reported with its node and its log's tail (kept on that node, at the run folder's path
there: `logs/vllm-<node>.log`), taken out of the proxy's rotation, and the run goes on with the others: a lost node
costs its share of generation, not the run. The run stops, naming every lost node, when none is left. A node lost
whole (its Ray actor gone with it) is reported the same way, without a log.

Each server is stopped with its actor when the run ends; if an actor dies without stopping it, the server's
first process gets SIGKILL from the kernel (`PR_SET_PDEATHSIG`), and vLLM's engine processes end with it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rich.console import Console

from agl_trainer.backends import EngineError


class NodeServer(Protocol):
    """An engine server started on this node: `VLLMServer`, or `AglEngineProcess` (tests on loopback clusters)."""

    url: str

    def check_alive(self) -> None:
        """Raise EngineError, with the log's tail, if the server has exited."""

    def log_tail(self, lines: int = 40) -> str: ...

    def stop(self) -> None: ...


# called on the server's node: (the node's address to listen on, a file-name-safe label of the node) → the started
# server. A module-level function (or a partial of one) so that Ray pickles it by reference.
Launch = Callable[[str, str], NodeServer]

START_TIMEOUT_S = 1800.0  # a large model's first load from a network filesystem, on every node at once
CHECK_TIMEOUT_S = 30.0


class ServerHost:
    """The Ray actor that runs one node's server (the module's docstring)."""

    def __init__(self, launch: Launch) -> None:
        self.launch = launch
        self.server: NodeServer | None = None

    def start(self, label: str) -> dict[str, Any]:
        import ray

        address = ray.util.get_node_ip_address()
        self.server = self.launch(address, label)
        proc = getattr(self.server, "proc", None)
        return {
            "url": self.server.url,
            "node_id": ray.get_runtime_context().get_node_id(),
            "host_pid": os.getpid(),
            "server_pid": getattr(proc, "pid", None),
        }

    def problem(self) -> str | None:
        """Why the server is not serving (it exited: its code and log's tail), or None."""
        if self.server is None:
            return "its server was never started"
        try:
            self.server.check_alive()
        except EngineError as exc:
            return str(exc)
        return None

    def log_tail(self, lines: int = 40) -> str:
        return self.server.log_tail(lines) if self.server is not None else "(no log)"

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


@dataclass
class Member:
    node: str  # as messages name it: "<ip> (node <id>)"
    url: str  # base URL, ending in /v1
    actor: Any
    pid: int | None = None  # the server's first process, on its node
    node_id: str = ""  # its Ray node


@dataclass
class EngineFleet:
    """The engine servers of a run, one per node (the module's docstring). `urls()` lists those alive;
    `check_alive()` reports and drops the dead ones (calling each `on_lost` with its URL) and raises when none is
    left; `stop()` ends them all."""

    members: list[Member]
    console: Console = field(default_factory=lambda: Console(stderr=True))
    settings: Any = None  # the servers' VLLMSettings (their dtype, their log's path on each node), when vLLM
    startup_s: float = 0.0
    on_lost: list[Callable[[str], object]] = field(default_factory=list)
    lost: list[tuple[str, str]] = field(default_factory=list)  # (node, why), in the order they were lost
    _retired: list[Member] = field(default_factory=list)  # lost members, whose actors still need stopping

    @property
    def headers(self) -> dict[str, str]:
        """What agl's requests to the servers carry: their key (one for the run's servers), when vLLM."""
        return dict(getattr(self.settings, "headers", None) or {})

    @classmethod
    def start(
        cls,
        launch: Launch | Sequence[Launch],
        nodes: Sequence[tuple[str, str]],
        *,
        gpus_per_server: int = 0,
        console: Console | None = None,
        settings: Any = None,
        timeout_s: float = START_TIMEOUT_S,
    ) -> EngineFleet:
        """A server on each of `nodes` ((Ray node id, name) pairs; a node named more than once runs as many servers,
        `launch` then one per entry: a server per GPU where LoRA needs it, `vllm_server.split_per_gpu`), each asking
        Ray for `gpus_per_server` GPUs of its node (0: it shares them with the trainer); all started, or none (the
        error names the node)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        console = console or Console(stderr=True)
        launches = list(launch) if isinstance(launch, Sequence) else [launch] * len(nodes)
        host = ray.remote(ServerHost)
        env = {"RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0"} if not gpus_per_server else {}
        actors = [
            host.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                num_cpus=0,
                num_gpus=gpus_per_server,
                runtime_env={"env_vars": env} if env else None,
                name=None,
            ).remote(each)
            for each, (node_id, _) in zip(launches, nodes, strict=True)
        ]
        t0 = time.monotonic()
        console.print(f"starting {len(nodes)} engine server(s): {', '.join(n for _, n in nodes)}")
        refs = [actor.start.remote(label(name)) for actor, (_, name) in zip(actors, nodes, strict=True)]
        fleet = cls([], console, settings)
        failures: list[str] = []
        for actor, ref, (node_id, name) in zip(actors, refs, nodes, strict=True):
            left = max(1.0, timeout_s - (time.monotonic() - t0))
            try:
                started = ray.get(ref, timeout=left)
            except Exception as exc:  # RayTaskError (its EngineError), GetTimeoutError, RayActorError
                failures.append(f"{name}: {_cause(exc)}")
                continue
            if started["node_id"] != node_id:  # soft=False: Ray never runs it elsewhere; said, should that change
                failures.append(f"{name}: its server started on node {started['node_id'][:8]}, not this one")
                continue
            fleet.members.append(Member(name, started["url"], actor, started["server_pid"], node_id))
        if failures:
            fleet.members = [Member(name, "", a) for a, (_, name) in zip(actors, nodes, strict=True)]
            fleet.stop()
            raise EngineError(
                f"{len(failures)} of {len(nodes)} engine server(s) did not start: " + " | ".join(failures)
            )
        fleet.startup_s = time.monotonic() - t0
        console.print(f"{len(nodes)} engine server(s) ready in {fleet.startup_s:.0f} s: {', '.join(fleet.urls())}")
        return fleet

    # ----------------------------------------------------------------------------------- the servers

    @property
    def url(self) -> str:
        """The first server alive (what a single-engine caller gets)."""
        if not self.members:
            raise EngineError(self._none_left())
        return self.members[0].url

    def urls(self) -> list[str]:
        return [m.url for m in self.members]

    def node_of(self, url: str) -> str:
        return next((m.node for m in self.members if m.url == url), "?")

    def describe(self) -> str:
        each = "one per node" if len({m.node_id for m in self.members}) == len(self.members) else "several per node"
        return f"{len(self.members)} engine servers, {each} ({', '.join(f'{m.node}: {m.url}' for m in self.members)})"

    def check_alive(self) -> None:
        """Report and drop the servers that have stopped; raise EngineError when none is left."""
        for member, problem in self._problems():
            if problem is not None:
                self._lose(member, problem)
        if not self.members:
            raise EngineError(self._none_left())

    def _problems(self) -> list[tuple[Member, str | None]]:
        """Each member and why it is not serving (None: it is). Asked of every node's actor at once."""
        import ray

        problems = {id(m): m.actor.problem.remote() for m in self.members}
        out: list[tuple[Member, str | None]] = []
        for member in list(self.members):
            try:
                problem = ray.get(problems[id(member)], timeout=CHECK_TIMEOUT_S)
            except Exception as exc:  # the actor is gone (its node with it), or does not answer
                problem = f"its Ray actor is lost ({_cause(exc)}): the node may have left the cluster"
            out.append((member, problem))
        return out

    def _lose(self, member: Member, problem: str) -> None:
        self.members.remove(member)
        self._retired.append(member)
        self.lost.append((member.node, problem))
        left = len(self.members)
        self.console.print(
            f"[red]engine server on {member.node} ({member.url}) stopped[/]: {problem}\n"
            + (f"  the run goes on with the other {left}" if left else "  no engine server is left")
        )
        for callback in self.on_lost:
            try:
                callback(member.url)
            except Exception as exc:  # e.g. the proxy is gone too: the run's end will say why
                self.console.print(f"  [yellow]could not take {member.url} out of the proxy's rotation: {exc}[/]")

    def _none_left(self) -> str:
        lost = "; ".join(f"{node}: {why}" for node, why in self.lost) or "none started"
        return f"every engine server has stopped ({lost})"

    def stop(self) -> None:
        """Stop every server (the lost ones' actors too), then their actors."""
        self._stop_members([*self.members, *self._retired])
        self.members, self._retired = [], []

    def _stop_members(self, members: Sequence[Member]) -> None:
        import ray

        actors = [m.actor for m in members]
        refs = [a.stop.remote() for a in actors]
        for ref in refs:
            try:
                ray.get(ref, timeout=60)
            except Exception:  # an actor already gone took its server with it (PR_SET_PDEATHSIG)
                pass
        for actor in actors:
            try:
                ray.kill(actor)
            except Exception:
                pass


def label(node: str) -> str:
    """A node's name as a file name: "10.0.0.2 (node 1a2b3c4d)" → "10.0.0.2-1a2b3c4d"."""
    return "".join(c if c.isalnum() or c in ".-" else "-" for c in node.replace(" (node ", "-")).strip("-")


def _cause(exc: BaseException) -> str:
    """The error a Ray task raised (its EngineError's message), else the exception itself."""
    cause = getattr(exc, "cause", None)
    return str(cause) if isinstance(cause, BaseException) else f"{type(exc).__name__}: {exc}"


def vllm_on_node(settings: Any, address: str, node_label: str) -> NodeServer:
    """`Launch` for vLLM: the plan's server, listening on the node's address, its log named after the node, killed
    with its actor."""
    import dataclasses

    from agl_trainer.engines.vllm_server import VLLMServer

    log_path = settings.log_path.with_name(f"vllm-{node_label}.log")
    server = VLLMServer(dataclasses.replace(settings, host=address, log_path=log_path), die_with_parent=True)
    return server.start()
