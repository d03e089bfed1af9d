"""The CrewAI guide's recipe, as written: a project made by `crewai create crew` (the pinned CrewAI, with the flags
its 1.15 needs to stay non-interactive and make the classic template), the guide's 7 lines added to `main.py`, run
by a real `agl worker` with the guide's environment against the scripted backend: each call stored under its
role, with the role's template as its key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from agl.client import Client
from agl.common.processes import ServerProcess
from agl.testing.fixtures import wait_rollouts

# the guide's diff to the template's main.py (docs/guides/crewai.md)
IMPORTS = "import agl\nimport agl_crewai\nagl_crewai.instrument()\n"
ROLLOUT = """

@agl.rollout
def research(task, llm):
    result = LatestAi().crew().kickoff(inputs={"topic": task["topic"], "current_year": "2026"})
    return float(bool(result.raw))
"""


def test_the_guides_template_recipe_through_a_real_worker(
    agl_server: ServerProcess, agl_client: Client, agl_workers: Any, tmp_path: Path
) -> None:
    crewai = str(Path(sys.executable).with_name("crewai"))
    made = subprocess.run(
        [crewai, "create", "crew", "latest_ai", "--classic", "--skip-provider"],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-2000:]
    project = tmp_path / "latest_ai"
    main = project / "src" / "latest_ai" / "main.py"
    source = main.read_text()
    anchor = "from latest_ai.crew import LatestAi\n"
    assert anchor in source  # the template the guide's diff applies to
    main.write_text(source.replace(anchor, anchor + IMPORTS) + ROLLOUT)
    added = len(IMPORTS.splitlines()) + len(ROLLOUT.strip().splitlines())
    assert added == 7  # the count the guide gives

    (rollout,) = agl_client.enqueue({"topic": "AI LLMs"})
    env = {"MODEL": "openai/agl-policy", "CREWAI_DISABLE_TELEMETRY": "true", "CREWAI_TRACING_ENABLED": "false"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(project / "src"), os.environ.get("PYTHONPATH")) if p)
    agl_workers(f"{main}:research", agl_server.url, env=env, cwd=project)  # the crew writes its report.md there
    (done,) = wait_rollouts(agl_client, [rollout.id], timeout=180)
    assert done.status.value == "succeeded", done.error
    calls = agl_client.rollout_detail(done.id).llm_calls
    seen = {(c.agent_name, c.agent_key) for c in calls}
    assert seen == {
        ("AI LLMs Senior Data Researcher", "{topic} Senior Data Researcher"),
        ("AI LLMs Reporting Analyst", "{topic} Reporting Analyst"),
    }, seen
    assert all(c.trainable for c in calls)
