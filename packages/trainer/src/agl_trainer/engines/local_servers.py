"""Several engine servers on this machine, presented to the run as one group (`agl train --engine vllm` with LoRA on
a machine of several GPUs, no Ray cluster).

vLLM 0.32 refuses more than one API server when LoRA adapters are loaded at run time, so a node's data-parallel
ranks behind one `vllm serve` share one API process; the plan runs a server per rank instead
(`vllm_server.split_per_gpu`). This group is what the rest of the run sees of them, with the interface of a Ray
cluster's servers (`EngineFleet`, whose reporting and dropping of a lost server it inherits): `urls()` for the
requests that must reach every server (sleep, wake, adapter loads, the log-prob check: agl_trainer.engines.fan_out)
and for the proxy's rotation (`agl serve --upstream` once per server), `url` and `headers` (one key for all),
`check_alive`, `on_lost`, `describe`, `startup_s` and `stop`.

The servers start at once (each loads its own copy of the model, so starting them one after another would take N
times as long); the run waits for all of them, and if one fails, it stops them all and says which one and why: a
run does not begin on part of its GPUs. The first is started in this thread, so that a SIGTERM meanwhile ends the
process through its `finally` blocks (`VLLMServer._stop_on_sigterm` acts in the main thread only), and stopped last.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Protocol

from rich.console import Console

from agl_trainer.backends import EngineError
from agl_trainer.engines.fleet import EngineFleet, Member, NodeServer


class StartableServer(NodeServer, Protocol):
    """A server not started yet: `start` returns it once it serves (`VLLMServer`, `AglEngineProcess`)."""

    def start(self) -> NodeServer: ...


@dataclass
class LocalServers(EngineFleet):
    """Engine servers that are child processes of this one (the module's docstring); each member's `actor` is
    its server itself (a `NodeServer`: `VLLMServer`, or `AglEngineProcess` in tests)."""

    @classmethod
    def start_all(
        cls,
        servers: Sequence[tuple[str, StartableServer]],
        *,
        console: Console | None = None,
        settings: Any = None,
    ) -> LocalServers:
        """Each of `servers` ((a name for messages, the server)) started at once; all started, or none (the error
        names each that failed). Interrupted (Ctrl-C, SIGTERM), every one is stopped before this returns."""
        console = console or Console(stderr=True)
        t0 = time.monotonic()
        console.print(f"starting {len(servers)} engine servers on this machine: {', '.join(n for n, _ in servers)}")
        errors: list[BaseException | None] = [None] * len(servers)

        def run(i: int) -> None:
            try:
                servers[i][1].start()
            except Exception as exc:  # reported with its name below, once the others have finished starting
                errors[i] = exc

        group = cls([], console, settings)
        group.members = [Member(name, "", server) for name, server in servers]  # what stop() reaches meanwhile
        pool = ThreadPoolExecutor(max_workers=max(1, len(servers) - 1), thread_name_prefix="agl-start")
        rest = [pool.submit(run, i) for i in range(1, len(servers))]
        try:
            if servers:
                run(0)
            wait(rest)
        except BaseException:
            # a server stopped while it starts fails its start at once; one whose thread had not begun yet is
            # stopped by the next round: every one is stopped when this raises
            while wait(rest, timeout=0)[1]:
                group.stop_servers()
                wait(rest, timeout=1.0)
            group.stop_servers()
            raise
        finally:
            pool.shutdown(wait=False)
        failures = [f"{name}: {error}" for (name, _), error in zip(servers, errors, strict=True) if error is not None]
        if failures:
            group.stop()
            raise EngineError(
                f"{len(failures)} of {len(servers)} engine server(s) did not start: " + " | ".join(failures)
            )
        for member in group.members:
            member.url = member.actor.url
            member.pid = getattr(getattr(member.actor, "proc", None), "pid", None)
        group.startup_s = time.monotonic() - t0
        console.print(f"{len(servers)} engine servers ready in {group.startup_s:.0f} s: {', '.join(group.urls())}")
        return group

    def stop_servers(self) -> None:
        """Stop every server, keeping the members (starting, a server may be stopped again)."""
        self._stop_members([*self.members, *self._retired])

    def describe(self) -> str:
        return f"{len(self.members)} engine servers on this machine ({', '.join(f'{m.node}: {m.url}' for m in self.members)})"

    def _problems(self) -> list[tuple[Member, str | None]]:
        out: list[tuple[Member, str | None]] = []
        for member in list(self.members):
            try:
                member.actor.check_alive()
                out.append((member, None))
            except EngineError as exc:
                out.append((member, str(exc)))
        return out

    def _stop_members(self, members: Sequence[Member]) -> None:
        # the first started (in the caller's thread, holding the SIGTERM handler) is stopped last, restoring it
        for member in reversed(members):
            try:
                member.actor.stop()
            except Exception as exc:  # the others are stopped all the same
                self.console.print(f"[yellow]could not stop the engine server {member.node}: {exc}[/]")


def vllm_servers_here(settings: Sequence[Any], console: Console | None = None) -> LocalServers:
    """The plan's vLLM servers of this machine (`vllm_server.split_per_gpu`), each named after its GPUs. They write
    the same chat template to the same file as they start (`VLLMServer.command`): the same text, and vLLM reads it
    only once its model is loaded, well after every server has written it."""
    from agl_trainer.engines.vllm_server import VLLMServer

    console = console or Console(stderr=True)
    servers: list[tuple[str, StartableServer]] = []
    for s in settings:
        gpus = "all GPUs" if s.gpu_ids is None else "GPU " + ",".join(map(str, s.gpu_ids))
        servers.append((gpus, VLLMServer(s, console)))
    return LocalServers.start_all(servers, console=console, settings=settings[0] if settings else None)
