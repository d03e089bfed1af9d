"""A throw-away Ray cluster of two nodes on this machine, for the several-nodes tests and benchmarks: two `ray start`
processes on loopback, the second joining the first, each declaring the CPUs and GPUs it is told (Ray only places
by them). Ray is imported only when a cluster is joined."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# token authentication off for this throw-away cluster on loopback, in its processes and in this one
ENV = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


def ray_cli() -> str:
    return str(Path(sys.executable).with_name("ray"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def two_nodes(tmp_path: Path, gpus: int = 2, cpus: int = 2) -> Iterator[str]:
    """A head node and a second node joining it, each with `cpus` CPUs and `gpus` declared GPUs; the address.
    Both run with `--block`, so this process owns them and stops them (and only them) at the end."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    common = ["--num-cpus", str(cpus), "--num-gpus", str(gpus), "--disable-usage-stats", "--block"]
    # Ray's unix sockets live under its temp dir, whose path must stay short (a socket path has ~107 bytes)
    temp = tempfile.mkdtemp(prefix="agl-ray-", dir="/tmp")
    head_args = ["--head", "--port", str(port), "--include-dashboard", "false", "--temp-dir", temp]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name, args in (("head", head_args), ("second", ["--address", address])):
            log = (tmp_path / f"ray-{name}.log").open("wb")
            procs.append(
                subprocess.Popen(
                    [ray_cli(), "start", *args, "--node-ip-address", "127.0.0.1", *common],
                    env=ENV,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
            time.sleep(3)  # the head's GCS listens before the second node dials it
            assert procs[-1].poll() is None, (tmp_path / f"ray-{name}.log").read_text()[-3000:]
        yield address
    finally:
        for proc in reversed(procs):
            proc.terminate()  # `ray start --block` stops its node's processes when it ends
        for proc in reversed(procs):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait(10)
        shutil.rmtree(temp, ignore_errors=True)


@contextmanager
def connected(address: str, nodes: int = 2, timeout_s: float = 90.0) -> Iterator[None]:
    import ray

    os.environ["RAY_AUTH_MODE"] = "disabled"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
            break
        except ConnectionError:
            assert time.monotonic() < deadline, f"no Ray head at {address}"
            time.sleep(1)
    try:
        while sum(1 for n in ray.nodes() if n.get("Alive")) < nodes:
            assert time.monotonic() < deadline, f"the second node did not join: {ray.nodes()}"
            time.sleep(0.5)
        yield
    finally:
        ray.shutdown()


def command_lines() -> list[tuple[int, str]]:
    """(pid, command line) of every live process of this machine: what a test or benchmark of workers on the
    cluster's nodes (all on this machine) counts, to see that none was left behind."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            found.append((int(cmdline.parent.name), cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")))
        except OSError:
            continue
    return found
