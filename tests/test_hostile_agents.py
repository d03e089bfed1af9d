"""A hostile agent cannot lose the run its data or grade itself. Each attack of tests/hostile_agent.py runs as a
rollout through real `agl serve --token` + `agl worker` (all at once, beside a victim rollout), in agl's default
sandbox: each is stopped, recorded where a limit was breached, and the run goes on, the worker alive, the server
answering, the store intact, no reward but the rollout function's.

What each attack tries, as an outside probe of agl's command-line agents did (they all succeeded before the sandbox):
write or delete outside the workspace (the store file, the run folder, the user's home, another rollout's
workspace); read a secret in the user's home, the store and another rollout's files; leave a symbolic link that the
evaluator then reads; reach a canary server on another local port, agl's REST API with the key it was given or a
guessed one; post its own reward and complete its own attempt; read the operator token through /proc; signal the
worker and the server; a fork bomb, a memory bomb, filling the disk; a daemon left behind; a program that ignores
SIGTERM past its time limit; a test that is a fork bomb, run by the evaluator."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agl.client import Client
from agl.common.processes import start_server, start_worker, stop_processes
from agl.testing.fixtures import wait_rollouts

APP = str(Path(__file__).with_name("hostile_apps.py")) + ":attack"
TOKEN = "operator-token-b7c1e9d4f2a8"
SECRET = "secret-of-the-users-home-5d2e8a"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Canary:
    """A TCP server on another local port that counts who reached it."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.sendall(b"canary reached\n")
            conn.close()


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory: pytest.TempPathFactory, agl_upstream: str) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp("hostile")
    home, shared, beats = base / "userhome", base / "shared", base / "beats"
    for folder in (home, shared, beats):
        folder.mkdir()
    (home / "secret.txt").write_text(SECRET)
    (home / "notes.txt").write_text("the user's notes\n")
    canary = Canary()
    server = start_server(base / "run", upstream=agl_upstream, token=TOKEN)
    store = base / "run" / "agl.sqlite"
    attacks: dict[str, dict[str, Any]] = {
        "write_outside": {
            "plan": {"targets": [str(store), str(base / "run" / "server.log"), str(home / "notes.txt")],
                     "delete": [str(store), str(home / "secret.txt")]},
        },
        "read_secrets": {"plan": {"targets": [str(home / "secret.txt"), str(store)]}},
        "symlinks": {"plan": {"secret": str(home / "secret.txt")}},
        "network": {"plan": {"canary_port": canary.port}},
        "self_reward": {},
        "proc_token": {},
        "signal": {},  # the pids are filled in below, once the worker runs
        "fork_bomb": {"timeout_s": 20},
        "memory_bomb": {"timeout_s": 20},
        "fill_disk": {"timeout_s": 20},
        "daemon": {"plan": {"beat": str(beats / "daemon")}, "writable": [str(beats)]},
        "ignore_sigterm": {"timeout_s": 3},
        "test_bomb": {},
    }  # fmt: skip
    env = {"HOME": str(home), "AGL_TOKEN": TOKEN}
    worker = start_worker(APP, server.url, concurrency=len(attacks) + 1, env=env, log_path=base / "worker.log")
    attacks["signal"]["plan"] = {"pids": [worker.pid, server.proc.pid if server.proc else 0, os.getpid()]}
    client = Client(server.url, token=TOKEN)
    try:
        modes = [m for m in attacks if m in ("write_outside", "read_secrets")]
        tasks = [{"mode": "victim", "shared": str(shared), "attackers": modes}]
        tasks += [{"mode": mode, "shared": str(shared), **spec} for mode, spec in attacks.items()]
        ids = [r.id for task in tasks for r in client.enqueue(task)]
        started = time.monotonic()
        rollouts = wait_rollouts(client, ids, timeout=240)
        details = {task["mode"]: client.rollout_detail(i) for task, i in zip(tasks, ids, strict=True)}
        yield {
            "details": details, "rollouts": rollouts, "seconds": time.monotonic() - started, "server": server,
            "worker": worker, "client": client, "store": store, "home": home, "base": base, "beats": beats,
            "canary": canary, "upstream": agl_upstream,
        }  # fmt: skip
    finally:
        client.close()
        stop_processes([worker], grace_s=10)
        server.stop()


def tail(detail: Any) -> str:
    (span,) = [s for s in detail.spans if s.name.startswith("cli:")]
    return str(span.attributes["cli.output_tail"])


def test_every_rollout_ends_as_its_rollout_function_said(hostile_run: dict[str, Any]) -> None:
    details = dict(hostile_run["details"])
    assert all(d.rollout.status.value == "succeeded" for d in details.values()), {
        m: (d.rollout.status.value, d.rollout.error) for m, d in details.items()
    }
    assert details.pop("victim").rollout.final_reward == 1.0  # its workspace as it left it: nothing planted, lost
    for mode, detail in details.items():
        assert detail.rollout.final_reward == 0.0, mode  # no agent graded itself
        assert {r.name for r in detail.rewards} <= {"final", "evaluated"}, (mode, detail.rewards)
        assert "DONE" not in tail(detail), (mode, tail(detail))  # every attack refused (its own account)


def test_the_worker_and_the_server_live_on_and_the_store_is_intact(hostile_run: dict[str, Any]) -> None:
    assert hostile_run["worker"].poll() is None
    assert httpx.get(f"{hostile_run['server'].url}/healthz", timeout=10).status_code == 200
    with sqlite3.connect(f"file:{hostile_run['store']}?mode=ro", uri=True) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert db.execute("SELECT count(*) FROM rollouts").fetchone() == (len(hostile_run["details"]),)
    home = hostile_run["home"]
    assert (home / "secret.txt").read_text() == SECRET and (home / "notes.txt").read_text() == "the user's notes\n"
    assert not list(hostile_run["base"].rglob("planted.txt"))
    # the engines are the run's own: none was added with a stolen or guessed credential
    answer = httpx.get(f"{hostile_run['server'].url}/api/v1/proxy/engines", headers=AUTH, timeout=10)
    assert [e["url"].rstrip("/") for e in answer.json()] == [hostile_run["upstream"].rstrip("/")]


def test_nothing_secret_reached_the_store_or_the_canary(hostile_run: dict[str, Any]) -> None:
    stored = json.dumps([d.model_dump(mode="json") for d in hostile_run["details"].values()])
    assert SECRET not in stored and TOKEN not in stored
    assert "victim's work" not in stored
    assert "SQLite format" not in stored  # the store file's own header, read and printed
    assert hostile_run["canary"].connections == 0
    (beside,) = [r for r in hostile_run["details"]["write_outside"].rewards if r.name == "evaluated"]
    assert "planted.txt" not in beside.metadata["beside"] and "workspace" in beside.metadata["beside"]
    (evaluated,) = [r for r in hostile_run["details"]["symlinks"].rewards if r.name == "evaluated"]
    assert "not read" in str(evaluated.metadata["read"])  # the evaluator did not follow the link out


def test_each_limit_breached_is_recorded_and_ends_the_command(hostile_run: dict[str, Any]) -> None:
    details = hostile_run["details"]
    for mode, limit in (("fork_bomb", "processes"), ("memory_bomb", "memory_mb"), ("fill_disk", "disk_mb")):
        names = [s.name for s in details[mode].spans]
        assert f"sandbox.limit:{limit}" in names, (mode, names, tail(details[mode]))
        (cli,) = [s for s in details[mode].spans if s.name.startswith("cli:")]
        assert cli.status.value == "error" and limit in str(cli.status_message)
    (cli,) = [s for s in details["ignore_sigterm"].spans if s.name.startswith("cli:")]
    assert "timed out" in str(cli.status_message)
    # the evaluator's own run of a test the agent left: stopped at the limit and recorded as well
    assert "sandbox.limit:processes" in [s.name for s in details["test_bomb"].spans]
    (evaluated,) = [r for r in details["test_bomb"].rewards if r.name == "evaluated"]
    assert any("processes" in b for b in evaluated.metadata["breaches"])


def test_no_process_outlives_its_rollout(hostile_run: dict[str, Any]) -> None:
    beat = hostile_run["beats"] / "daemon"
    assert beat.exists()  # the daemon did run
    before = beat.read_text()
    time.sleep(0.5)
    assert beat.read_text() == before
    (cli,) = [s for s in hostile_run["details"]["daemon"].spans if s.name.startswith("cli:")]
    assert int(cli.attributes["cli.left_behind"]) >= 1  # killed with the sandbox, and said
