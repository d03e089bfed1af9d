"""Every SDK's base-URL variable (issue #43): a client of each OpenAI-compatible library, built at import time with
no base URL, reaches agl through the variables `agl worker` sets (OPENAI_BASE_URL, OPENAI_API_BASE), with the
user's environment holding none of them; each call recorded, none bypassing agl."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from agl.client import Client
from agl.common.processes import ServerProcess
from agl.testing.fixtures import wait_rollouts

APP = Path(__file__).with_name("sdk_clients_app.py")
# each library, and the variable it reads (read in their sources: the guide's table)
EXPECTED = {"openai", "langchain-openai", "llama-index", "litellm", "dspy", "agno", "haystack", "smolagents"}


def installed_clients() -> list[str]:
    code = (
        f"import sys; sys.path.insert(0, {str(APP.parent)!r}); import sdk_clients_app as a; print(','.join(a.CLIENTS))"
    )
    env = {**os.environ, "OPENAI_API_KEY": "listing"}  # the SDK refuses to build a client without a key
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1].split(",")


def test_each_librarys_import_time_client_reaches_agl(agl_server: ServerProcess, tmp_path: Path) -> None:
    clients = installed_clients()
    assert set(clients) >= EXPECTED, clients  # the pinned environment has them all
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AGL_"))}
    with Client(agl_server.url) as client:
        ids = {name: client.enqueue({"client": name})[0].id for name in clients}
        log = (tmp_path / "worker.log").open("ab")
        worker = [sys.executable, "-m", "agl.cli.main", "worker", f"{APP}:ask", f"--server={agl_server.url}"]
        proc = subprocess.Popen(worker, stdout=log, stderr=log, env=env)
        try:
            rollouts = wait_rollouts(client, list(ids.values()), timeout=180)
        finally:
            proc.terminate()
            proc.wait(15)
        by_name: dict[str, Any] = {name: r for name, r in zip(ids, rollouts, strict=True)}
        failed = {n: (r.status.value, r.error) for n, r in by_name.items() if r.status.value != "succeeded"}
        assert not failed, (failed, (tmp_path / "worker.log").read_text()[-3000:])
        for name, rollout in by_name.items():
            detail = client.rollout_detail(rollout.id)
            assert len(detail.llm_calls) >= 1 and all(c.trainable for c in detail.llm_calls), name
            assert not rollout.bypassed_llm_calls, name
