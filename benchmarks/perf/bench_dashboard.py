"""The dashboard's rollouts table at 100,000 rollouts: how long a page takes over real HTTP from `agl serve`,
first page and deep pages (keyset paging), unfiltered and filtered. Target: every page ≤ 250 ms (p50), and a deep
page no slower than 3× the first (no OFFSET scan).

The store is filled directly (the server's own `Store`, 1,000 tasks × 100 rollouts in train/eval modes over 50
steps, a tenth of them with one LLM call of agent `writer` or `checker`), then `agl serve --run-dir` serves it.
"""

from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from _common import median, report

from agl.common.processes import start_server
from agl.schema import Attribution, EnqueueRequest, LLMCall, TaskIn
from agl.store import Store

ROLLOUTS = 100_000
PER_TASK = 100
TARGET_MS = 250.0


def fill(run_dir: Path, rollouts: int = ROLLOUTS) -> None:
    with Store(run_dir) as store:
        for k in range(rollouts // PER_TASK):
            mode = "eval" if k % 10 == 0 else "train"
            store.enqueue(EnqueueRequest(task=TaskIn(input={"q": k}), n=PER_TASK, mode=mode, step=k % 50))
            if k % 10 == 1:  # a tenth of the rollouts run and make one call
                for i, claim in enumerate(store.claim("bench", PER_TASK, 3600).result()):
                    store.add_llm_call(
                        LLMCall(
                            id=f"llm-{claim.attempt.id}",
                            rollout_id=claim.rollout.id,
                            attempt_id=claim.attempt.id,
                            seq=0,
                            agent_name="writer" if i % 2 else "checker",
                            attribution=Attribution.scope,
                            trace_id=None,
                            parent_span_id=None,
                            model_requested="m",
                            model="m",
                            model_version=1,
                            request={"messages": [{"role": "user", "content": "q"}]},
                            response_message={"role": "assistant", "content": "a"},
                            prompt_ids=[1, 2, 3],
                            response_ids=[4],
                            logprobs=[-0.1],
                            finish_reason="stop",
                            stream=False,
                            status="ok",
                            http_status=200,
                            error=None,
                            started_at=0.0,
                            latency_s=0.01,
                            usage={},
                            trainable=True,
                            not_trainable_reason=None,
                        )
                    )
                    store.complete(claim.attempt.id, "succeeded", reward=float(i % 2), after_llm_seq=0)
        store.counts()  # waits for nothing but proves the file reads back


def timed(client: httpx.Client, path: str, repeats: int = 5) -> tuple[float, str]:
    times, text = [], ""
    for _ in range(repeats):
        t0 = time.perf_counter()
        response = client.get(path)
        times.append((time.perf_counter() - t0) * 1000)
        response.raise_for_status()
        text = response.text
    return median(times), text


def main(rollouts: int = ROLLOUTS, deep_pages: int = 200, far_pages: int = 150) -> dict[str, Any]:
    rows: dict[str, Any] = {"rollouts": rollouts}
    with tempfile.TemporaryDirectory(prefix="agl-bench-dash-") as tmp:
        run_dir = Path(tmp) / "run"
        t0 = time.perf_counter()
        fill(run_dir, rollouts)
        rows["fill s"] = time.perf_counter() - t0
        server = start_server(run_dir)
        try:
            with httpx.Client(base_url=server.url, timeout=60) as client:
                first_ms, html = timed(client, "/ui/rollouts")
                rows["first page, ms (p50)"] = first_ms
                # walk 200 pages deep by following the next links, then time the page found there
                path = "/ui/rollouts"
                for _ in range(deep_pages):
                    found = re.search(r"<a rel=next href='([^']+)'", html)
                    assert found, "ran out of pages"
                    path = found[1].replace("&amp;", "&")
                    html = client.get(path).text
                deep_ms, _ = timed(client, path)
                rows["page 201 (rows 10,001-10,050), ms (p50)"] = deep_ms
                api = client.get("/ui/api/rollouts", params={"size": 50}).json()
                cursor = api["next"]
                last = client.get("/ui/api/rollouts", params={"size": 500}).json()
                for _ in range(far_pages):  # 75,000 rows further on
                    last = client.get("/ui/api/rollouts", params={"size": 500, "after": cursor}).json()
                    cursor = last["next"]
                rows["page at row ~75,000, ms (p50)"], _ = timed(client, f"/ui/api/rollouts?size=50&after={cursor}")
                for name, query in (
                    ("status=succeeded", "status=succeeded"),
                    ("mode=eval", "mode=eval"),
                    ("step=7", "step=7"),
                    ("agent=writer", "agent=writer"),
                    ("reward >= 1", "min_reward=1"),
                ):
                    rows[f"filtered {name}, ms (p50)"], _ = timed(client, f"/ui/rollouts?{query}")
                rows["overview page, ms (p50)"], _ = timed(client, "/ui")
        finally:
            server.stop()
    pages = [v for k, v in rows.items() if k.endswith("ms (p50)")]
    rows["target: every page ms ≤"] = TARGET_MS
    rows["meets target"] = max(pages) <= TARGET_MS and rows["page 201 (rows 10,001-10,050), ms (p50)"] <= 3 * first_ms
    report("dashboard", rows)
    return rows


def smoke() -> None:
    """`make bench-smoke`: that this script runs, at a small size (the numbers are not judged)."""
    main(rollouts=2_000, deep_pages=3, far_pages=2)


if __name__ == "__main__":
    main()
