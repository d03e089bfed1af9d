"""LLM calls that never reach agl are caught, not lost without a word (issue #29, friction 1).

Inside a rollout, agl's HTTP hook sees every request the agent sends: one to an LLM route (`/chat/completions`,
`/completions`, `/responses`, `/messages`) on another host than agl's is a bypassed call. The runner reports the
count and the first URL with the attempt, warns once per worker, and `agl show`, the dashboard, the trainer's
step line and metrics count it. Calls to another model on purpose (`agl.external_llm()`, an allow-listed host)
are counted apart and never warned about.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from agl.client import Client
from agl.common.processes import ServerProcess, start_worker
from agl.testing.fixtures import wait_rollouts

AGENT = str(Path(__file__).resolve().parent / "e2e_agents.py") + ":elsewhere_agent"


def run(server: ServerProcess, tasks: list[dict[str, Any]], log: Path, env: dict[str, str] | None = None) -> list[Any]:
    proc = start_worker(AGENT, server.url, log_path=log, env=env)
    try:
        with Client(server.url) as client:
            ids = [r.id for task in tasks for r in client.enqueue(task)]
            rollouts = wait_rollouts(client, ids, timeout=60)
            return [client.rollout_detail(r.id) for r in rollouts]
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_call_sent_around_agl_is_counted_warned_about_and_shown(
    agl_server: ServerProcess, agl_upstream: str, tmp_path: Path
) -> None:
    nowhere = "http://127.0.0.1:9/v1"  # the discard port: nothing listens
    tasks = [
        {"elsewhere": agl_upstream},
        {"elsewhere": agl_upstream, "through_agl": True},
        {"elsewhere": agl_upstream, "refused": True},
        {"elsewhere": nowhere, "unreached": True},
    ]
    details = run(agl_server, tasks, tmp_path / "worker.log")
    lost, mixed, _refused, unreached = details
    assert [d.rollout.status.value for d in details] == ["succeeded"] * 4  # answered (or caught) all the same
    for d in details:
        (attempt,) = d.attempts
        assert attempt.bypassed_llm_calls == 1 and d.rollout.bypassed_llm_calls == 1
        assert attempt.bypassed_llm_url is not None and attempt.bypassed_llm_url.endswith("/v1/chat/completions")
        assert attempt.external_llm_calls == 0
    assert lost.llm_calls == [] and len(mixed.llm_calls) == 1  # only the call through agl was recorded
    # what became of each: answered there, refused, or reached no server; said so, not "answered" for all
    stories = [d.attempts[0].bypass_story() for d in details]
    assert stories == [
        "1 answered there, never recorded",
        "1 answered there, never recorded",
        "1 refused (an HTTP error)",
        "1 reached no server",
    ]
    log = (tmp_path / "worker.log").read_text()
    assert log.count("not to agl (") == 1  # once per worker
    assert "agl.external_llm()" in log and "OPENAI_BASE_URL" in log
    shown = subprocess.run(
        [sys.executable, "-m", "agl.cli.main", "show", lost.rollout.id, f"--server={agl_server.url}"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "300"},  # one line per line, however long
    ).stdout
    assert "1 LLM call(s) bypassed agl" in shown and f"{agl_upstream}/chat/completions" in shown
    assert "1 answered there, never recorded" in shown
    assert "every LLM call bypassed agl (1)" in shown.splitlines()[0]  # the rollout's status line says it
    # a distinct reason where rollouts are left out of training: not "no trainable call"
    from agl.learn.transitions import build_episodes

    _, stats = build_episodes(details)
    assert stats.dropped_rollouts["every LLM call bypassed agl"] == 3 and stats.episodes == 1
    exported = subprocess.run(
        [
            sys.executable,
            "-m",
            "agl.cli.main",
            "export",
            f"--server={agl_server.url}",
            "--agents=solver",
            "-o",
            str(tmp_path / "x.jsonl"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "300"},
    )
    assert "every LLM call bypassed agl: 3" in exported.stdout + exported.stderr, exported.stdout + exported.stderr
    page = httpx.get(f"{agl_server.url}/ui/rollouts/{unreached.rollout.id}").text
    assert "1 LLM call(s) bypassed agl" in page and "1 reached no server" in page
    assert "every LLM call bypassed agl (1)" in page
    listed = subprocess.run(
        [sys.executable, "-m", "agl.cli.main", "rollouts", f"--server={agl_server.url}"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert listed.count("every LLM call bypassed agl (1)") == 3  # lost, refused, unreached: nothing recorded
    assert listed.count("1 LLM call(s) bypassed agl") == 1  # mixed: one of its calls reached agl


def test_calls_to_another_model_on_purpose_are_counted_apart(
    agl_server: ServerProcess, agl_upstream: str, tmp_path: Path
) -> None:
    host = httpx.URL(agl_upstream).host
    port = httpx.URL(agl_upstream).port
    (scoped,) = run(agl_server, [{"elsewhere": agl_upstream, "intended": True}], tmp_path / "a.log")
    (listed,) = run(
        agl_server, [{"elsewhere": agl_upstream}], tmp_path / "b.log", env={"AGL_EXTERNAL_LLM_HOSTS": f"{host}:{port}"}
    )
    for d in (scoped, listed):
        (attempt,) = d.attempts
        assert (attempt.bypassed_llm_calls, attempt.external_llm_calls) == (0, 1)
    assert "never recorded" not in (tmp_path / "a.log").read_text() + (tmp_path / "b.log").read_text()
