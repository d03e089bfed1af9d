"""The example app, run by a real `agl worker` process as a user would run it."""

from __future__ import annotations

import subprocess
from collections import Counter
from collections.abc import Callable

from lc_support import EXAMPLE_PATH, TASK, calls, tool_spans

from agl.client import Client
from agl.common.processes import ServerProcess
from agl.testing.fixtures import wait_rollouts


def test_example_app_runs_in_an_agl_worker(
    agl_server: ServerProcess, agl_client: Client, agl_workers: Callable[..., subprocess.Popen[bytes]]
) -> None:
    rollouts = [*agl_client.enqueue(TASK), *agl_client.enqueue({**TASK, "keyword": "sun"})]
    agl_workers(f"{EXAMPLE_PATH}:write_essay", agl_server.url, concurrency=2)
    done = wait_rollouts(agl_client, [r.id for r in rollouts])
    assert [r.status.value for r in done] == ["succeeded", "succeeded"]
    details = [agl_client.rollout_detail(r.id) for r in done]
    # the rewritten text uses "moon" but not "sun": full reward, then half (still short enough)
    assert [[w.value for w in d.rewards] for d in details] == [[1.0], [0.5]]
    for detail in details:
        assert Counter(c.agent_name for c in calls(detail)) == {"checker": 4, "writer": 1, "rewriter": 1}
        assert all(c.attribution.value == "scope" and c.trainable for c in calls(detail))
        assert [s.status.value for s in tool_spans(detail)] == ["ok", "ok"]
