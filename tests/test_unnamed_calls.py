"""A rollout only partly attributed is said so, once per worker, naming the agents its other calls were under and
the fix for the framework the app loaded (DSPy's modules carry no agent name): before, only a rollout with no named
call at all got a warning. Real DSPy, real `agl serve` and `agl worker`."""

from __future__ import annotations

from pathlib import Path

from agl.client import Client
from agl.common.processes import ServerProcess
from agl.testing.fixtures import worker_until_done

APP = Path(__file__).with_name("partly_named_app.py")


def test_a_partly_unnamed_rollout_is_said_once_with_the_fix(agl_server: ServerProcess, tmp_path: Path) -> None:
    with Client(agl_server.url) as client:
        ids = [client.enqueue({"n": i})[0].id for i in range(2)]
        log_path = tmp_path / "worker.log"
        rollouts = worker_until_done(f"{APP}:solve", agl_server.url, ids, log_path)
        said = log_path.read_text()
        assert all(r.status.value == "succeeded" for r in rollouts), said[-3000:]
        names = [[c.agent_name for c in client.rollout_detail(i).llm_calls] for i in ids]
    assert names == [["solver", None], ["solver", None]]
    assert said.count("reached agl without an agent name") == 1, said
    assert "1 of 2 LLM call(s) of rollout" in said and "beside calls of solver (1)" in said
    assert "DSPy modules carry no agent name" in said
