"""The SWE-bench agent: mini-swe-agent resolves the issue in a clone of the repository; the patch is its `git diff`.

    agl worker agl_bench.swebench.agent:solve --server http://127.0.0.1:8000

Each rollout clones the instance's repository (`repo_url`) into a fresh `agl.workspace`, checks out
`base_commit`, and runs mini-swe-agent there through `agl.run_cli` with the problem statement (every model call it
makes is stored under the agent `mini-swe-agent`). What it leaves is the patch: `git add -A` then
`git diff --cached <base_commit>` (new files included, commits it made too; its own files are kept outside the
clone). `report` stores the patch as the prediction, and a `swebench:prediction` span holds it whole, in the
official format (`report` cuts texts at 4,000 characters).

The reward. Grading a patch takes the official harness, which builds a Docker image per instance and runs its
tests (minutes each), and this project's machines have no container runtime. So: with `evaluate: true` the rollout
grades its own patch through `evaluate.run_evaluation` (one instance, one worker) and the reward is 1 when the
instance is resolved, else 0 — what training needs, on a machine with Docker (without one the rollout fails with
the setup error: a reward of 0 would look like a real grade). Without it (the default) the reward is 0 and
`resolved` is not reported: the patch is kept (the span, and `predictions`, a JSON Lines file every rollout appends
its official prediction to) for a later `python -m agl_bench.swebench.evaluate predictions.jsonl ...`. A 0 from an
ungraded rollout is no grade; `patch_produced` (1 when the diff is not empty) is the one metric such a run measures.

Task input: `{instance_id, repo, base_commit, problem_statement, ...}` (see `data.py`) and these optional keys:
- `repo_url` (default `https://github.com/{repo}.git`): where to clone from; `{repo}` (owner/name) and
  `{repo_dir}` (owner__name) are filled in, so a folder of local mirrors works (`/mirrors/{repo_dir}`), and a path
  to one repository too;
- `harness_steps` (default 40), `max_tokens` (per call, default 2048), `harness_timeout_s` (default 1800),
  `harness_prompt` (a template with {problem_statement}, {repo}, {instance_id}, {base_commit}, {hints}: replaces the
  instructions; tests put scripted-model directives here);
- `evaluate` (bool), `eval_timeout_s` (one instance's tests, default 1800), `eval_dir` (keep the harness's logs
  there), `swebench_python` (else AGL_SWEBENCH_PYTHON, else .venv-harness/bin/python);
- `predictions` (a path): append this rollout's prediction there; `model_name` (its `model_name_or_path`,
  default `agl-<the model's name>`).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import agl
from agl_bench.quixbugs.harness import QUIET, mini_command
from agl_bench.results import report
from agl_bench.swebench import HARNESS
from agl_bench.swebench.evaluate import Prediction, run_evaluation

DEFAULT_REPO_URL = "https://github.com/{repo}.git"
PREDICTION_SPAN = "swebench:prediction"
PROMPT = (
    "You are in a clone of the repository {repo} at commit {base_commit}. Resolve the issue below by editing the "
    "repository's source files (not its tests) in the current directory.\n\n<issue>\n{problem_statement}\n</issue>\n\n"
    "When the issue is resolved, finish."
)
GIT_ENV = {"GIT_TERMINAL_PROMPT": "0", "GIT_AUTHOR_NAME": "agl", "GIT_AUTHOR_EMAIL": "agl@localhost"}
GIT_ENV |= {"GIT_COMMITTER_NAME": "agl", "GIT_COMMITTER_EMAIL": "agl@localhost"}


def _git(args: list[str], cwd: Path, timeout_s: float = 1800) -> str:
    done = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout_s, env={**os.environ, **GIT_ENV}
    )
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {cwd}: {(done.stderr or done.stdout).strip()[-800:]}")
    return done.stdout


def repo_url(task: dict[str, Any]) -> str:
    template = str(task.get("repo_url") or DEFAULT_REPO_URL)
    return template.replace("{repo}", str(task["repo"])).replace("{repo_dir}", str(task["repo"]).replace("/", "__"))


def checkout(url: str, commit: str, into: Path) -> None:
    """`into` becomes a clone of `url` at `commit` (detached): a shallow fetch of that one commit, else the whole
    history (a server that refuses a commit it does not advertise)."""
    into.mkdir(parents=True)
    _git(["init", "-q"], into)
    _git(["remote", "add", "origin", url], into)
    try:
        _git(["fetch", "-q", "--depth", "1", "origin", commit], into)
    except RuntimeError:
        _git(["fetch", "-q", "origin"], into)
    _git(["checkout", "-q", "--detach", commit], into)


def patch_of(repo: Path, base_commit: str) -> str:
    """What the agent changed since `base_commit`: every file, new ones included, as one diff."""
    _git(["add", "-A"], repo)
    return _git(["diff", "--cached", "--no-color", "--no-ext-diff", base_commit], repo)


def fill(template: str, task: dict[str, Any]) -> str:
    # replaced, not str.format: a template may hold JSON (a scripted model's directives), braces and all
    fields = {
        "{problem_statement}": str(task["problem_statement"]),
        "{repo}": str(task["repo"]),
        "{instance_id}": str(task["instance_id"]),
        "{base_commit}": str(task["base_commit"]),
        "{hints}": str(task.get("hints_text") or ""),
    }
    for field, value in fields.items():
        template = template.replace(field, value)
    return template


def run_harness(task: dict[str, Any], llm: agl.LLM) -> tuple[str, agl.CliResult]:
    """Clone, run mini-swe-agent in the clone, and return (its patch, the run)."""
    with agl.workspace() as ws:
        repo = ws / "repo"
        checkout(repo_url(task), str(task["base_commit"]), repo)
        mini = agl.agent_home(ws) / ".mini"  # mini's own files (config, trajectory): outside the clone and its diff
        argv = [mini_command(), "-t", fill(str(task.get("harness_prompt") or PROMPT), task)]
        argv += ["--yolo", "--exit-immediately", "-l", "0", "-o", str(mini / "run.json"), "-m", f"openai/{llm.model}"]
        argv += ["-c", "mini.yaml", "-c", f"agent.step_limit={int(task.get('harness_steps') or 40)}"]
        argv += ["-c", f"model.model_kwargs.max_tokens={int(task.get('max_tokens') or 2048)}"]
        env = {**QUIET, "MSWEA_GLOBAL_CONFIG_DIR": str(mini)}
        timeout_s = float(task.get("harness_timeout_s") or 1800)
        # in agl's sandbox: the clone the one writable folder, no network but the attempt's LLM
        done = agl.run_cli(argv, llm=llm, agent=HARNESS, cwd=repo, env=env, timeout_s=timeout_s)
        agl.record_tool_runs(mini / "run.json", "mini-swe-agent", agent=HARNESS)  # its commands as tool spans for AIR
        return patch_of(repo, str(task["base_commit"])), done


def append_prediction(path: Path, prediction: Prediction) -> None:
    """One JSON line, written with one `write` on a file opened for appending (rollouts run side by side)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(prediction.to_json()) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


@agl.rollout
def solve(task: dict[str, Any], llm: agl.LLM) -> float:
    patch, run = run_harness(task, llm)
    prediction = Prediction(str(task["instance_id"]), patch, str(task.get("model_name") or f"agl-{llm.model}"))
    now = time.time()
    agl.record_span(
        PREDICTION_SPAN,
        kind="bench_prediction",
        start_time=now,
        end_time=now,
        attributes={"swebench.prediction": json.dumps(prediction.to_json())},
    )
    if task.get("predictions"):
        append_prediction(Path(str(task["predictions"])).expanduser(), prediction)
    metrics = {"patch_produced": 1.0 if patch.strip() else 0.0}
    info: dict[str, Any] = {"harness_exit": run.returncode, "harness_timed_out": run.timed_out}
    if task.get("evaluate"):
        status = grade(task, prediction)
        metrics["resolved"] = 1.0 if status == "resolved" else 0.0
        info["status"] = status
    report(
        metrics,
        prediction=patch,
        gold=f"FAIL_TO_PASS of {task['instance_id']}: {', '.join(task['FAIL_TO_PASS'])}",
        id=task["instance_id"],
        evaluated=bool(task.get("evaluate")),
        patch_chars=len(patch),
        **info,
    )
    return metrics.get("resolved", 0.0)


def grade(task: dict[str, Any], prediction: Prediction) -> str:
    """The official harness's verdict on this one prediction (resolved, unresolved, empty_patch, error)."""
    if not prediction.model_patch.strip():
        return "empty_patch"  # nothing to apply: the harness would not run it either
    eval_dir = task.get("eval_dir")
    grading = run_evaluation(
        [prediction],
        dataset=str(task.get("dataset_file") or task.get("dataset") or "princeton-nlp/SWE-bench_Lite"),
        split=str(task.get("split") or "test"),
        run_id=f"agl-{task['instance_id']}-{uuid.uuid4().hex[:8]}",
        workdir=Path(str(eval_dir)).expanduser() if eval_dir else None,
        max_workers=1,
        timeout_s=int(task.get("eval_timeout_s") or 1800),
        python=str(task["swebench_python"]) if task.get("swebench_python") else None,
    )
    return grading.statuses[prediction.instance_id]
