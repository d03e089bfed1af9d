"""`agl worker` turns the answer caches it knows off (agl.capture.answer_caches): a DSPy program keeps DSPy's
default cache, and without this the second and later rollouts of a task (a GRPO group) were answered from it,
stored no call and trained nothing, each succeeding with its reward. Real DSPy, real `agl serve` and `agl worker`."""

from __future__ import annotations

from pathlib import Path

import pytest

from agl.client import Client
from agl.common.processes import ServerProcess
from agl.testing.fixtures import worker_until_done

APP = Path(__file__).with_name("dspy_cached_app.py")


@pytest.mark.parametrize("keep", [False, True])
def test_every_rollout_of_a_dspy_program_reaches_the_engine(
    agl_server: ServerProcess, tmp_path: Path, keep: bool
) -> None:
    extra = {"DSPY_CACHEDIR": str(tmp_path / "dspy-cache")}  # DSPy's own folder for its disk cache: not the user's
    if keep:
        extra["AGL_KEEP_ANSWER_CACHES"] = "1"
    with Client(agl_server.url) as client:
        ids = [client.enqueue({"n": i})[0].id for i in range(3)]
        log_path = tmp_path / "worker.log"
        rollouts = worker_until_done(f"{APP}:ask", agl_server.url, ids, log_path, env=extra, args=("-n", "1"))
        assert all(r.status.value == "succeeded" for r in rollouts), log_path.read_text()[-3000:]
        stored = [len(client.rollout_detail(r.id).llm_calls) for r in rollouts]
    if keep:  # the app's own choice: the first answer is cached, the later rollouts store nothing
        assert stored == [1, 0, 0], stored
    else:
        assert stored == [1, 1, 1], stored
        assert "turned DSPy's answer cache off" in log_path.read_text()
