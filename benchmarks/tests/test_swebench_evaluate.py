"""The official SWE-bench harness as agl runs it: predictions in the official format, the command line with
swebench 5.0.2's argument names, its report read into each instance's verdict, and the clear error when no
container runtime answers. Docker is not here: the harness is a stand-in (`fake_harness`, a script that records
its arguments and writes a report in the official shape) and so is `docker` (`fake_docker`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from agl_bench.swebench.evaluate import (
    Prediction,
    SWEbenchRunError,
    SWEbenchSetupError,
    read_predictions,
    run_evaluation,
    write_predictions,
)

# A stand-in for `python -m swebench.harness.run_evaluation`: `-c ...` (the import probe) succeeds; a run records
# its argv and working folder beside itself, and writes the report run_evaluation.make_run_report writes: an instance
# whose patch holds "BROKEN" unresolved, an empty patch in empty_patch_ids, the others resolved.
FAKE_HARNESS = r"""#!{python}
import json, os, sys
from pathlib import Path

if sys.argv[1] == "-c":
    sys.exit(0)
args = sys.argv[1:]
Path(__file__).with_suffix(".calls.jsonl").open("a").write(json.dumps({"argv": args, "cwd": os.getcwd()}) + "\n")
def value(flag):
    return args[args.index(flag) + 1]
ids = []
for a in args[args.index("--instance_ids") + 1 :]:
    if a.startswith("--"):
        break
    ids.append(a)
preds = {p["instance_id"]: p for p in map(json.loads, open(value("--predictions_path")))}
empty = [i for i in ids if not preds[i]["model_patch"]]
broken = [i for i in ids if "BROKEN" in preds[i]["model_patch"]]
resolved = [i for i in ids if i not in empty and i not in broken]
report = {
    "total_instances": len(ids), "submitted_instances": len(preds), "completed_instances": len(resolved) + len(broken),
    "resolved_instances": len(resolved), "unresolved_instances": len(broken), "empty_patch_instances": len(empty),
    "error_instances": 0, "completed_ids": sorted(resolved + broken), "incomplete_ids": [], "empty_patch_ids": empty,
    "submitted_ids": sorted(preds), "resolved_ids": resolved, "unresolved_ids": broken, "error_ids": [],
    "schema_version": 2,
}
name = next(iter(preds.values()))["model_name_or_path"].replace("/", "__")
out = Path(value("--report_dir"))
out.mkdir(parents=True, exist_ok=True)
(out / f"{name}.{value('--run_id')}.json").write_text(json.dumps(report, indent=4))
print("Report written")
"""


def fake_harness(folder: Path) -> Path:
    path = folder / "swebench-python"
    path.write_text(FAKE_HARNESS.replace("{python}", sys.executable))
    path.chmod(0o755)
    return path


def harness_calls(python: Path) -> list[dict[str, object]]:
    log = python.with_suffix(".calls.jsonl")
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def fake_docker(folder: Path, *, answers: bool) -> Path:
    """A `docker` whose `info` answers, or fails as Docker's CLI does with no daemon."""
    path = folder / "docker"
    body = (
        "echo 'Server Version: 27.0.0'\nexit 0\n"
        if answers
        else "echo 'Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon "
        "running?' >&2\nexit 1\n"
    )
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


PREDICTIONS = [
    Prediction("astropy__astropy-12907", "diff --git a/x.py b/x.py\n+fixed\n", "agl/qwen"),
    Prediction("django__django-11099", "diff --git a/y.py b/y.py\n+BROKEN\n", "agl/qwen"),
    Prediction("sympy__sympy-20590", "", "agl/qwen"),
]


def test_predictions_are_written_in_the_official_format_and_read_back(tmp_path: Path) -> None:
    path = write_predictions(PREDICTIONS, tmp_path / "p.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows[0] == {
        "instance_id": "astropy__astropy-12907",
        "model_name_or_path": "agl/qwen",
        "model_patch": "diff --git a/x.py b/x.py\n+fixed\n",
    }
    assert read_predictions(path) == PREDICTIONS
    with pytest.raises(ValueError, match="share model_name_or_path"):
        write_predictions([PREDICTIONS[0], Prediction("a", "", "other")], tmp_path / "q.jsonl")


def test_the_official_harness_runs_with_its_arguments_and_its_report_gives_each_verdict(tmp_path: Path) -> None:
    python = fake_harness(tmp_path)
    docker = fake_docker(tmp_path, answers=True)
    work = tmp_path / "work"
    work.mkdir()
    dataset = tmp_path / "test-00000-of-00001.parquet"
    grading = run_evaluation(
        PREDICTIONS,
        dataset=str(dataset),
        split="test",
        run_id="run1",
        workdir=work,
        max_workers=2,
        timeout_s=900,
        python=str(python),
        docker=str(docker),
    )
    assert grading.statuses == {
        "astropy__astropy-12907": "resolved",
        "django__django-11099": "unresolved",
        "sympy__sympy-20590": "empty_patch",
    }
    assert grading.resolved("astropy__astropy-12907") and not grading.resolved("django__django-11099")
    assert grading.report_path == work / "reports" / "agl__qwen.run1.json"
    (call,) = harness_calls(python)
    predictions = work / "predictions.run1.jsonl"
    assert call == {
        "argv": [
            "-m",
            "swebench.harness.run_evaluation",
            "--dataset_name",
            str(dataset),
            "--split",
            "test",
            "--predictions_path",
            str(predictions),
            "--instance_ids",
            "astropy__astropy-12907",
            "django__django-11099",
            "sympy__sympy-20590",
            "--run_id",
            "run1",
            "--max_workers",
            "2",
            "--timeout",
            "900",
            "--report_dir",
            str(work / "reports"),
        ],
        "cwd": str(work),  # its logs/run_evaluation/ are kept there
    }
    assert grading.command[0] == str(python)
    assert read_predictions(predictions) == PREDICTIONS
    assert "Report written" in (work / "harness.run1.log").read_text()


def test_without_a_container_runtime_nothing_runs_and_the_error_says_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python = fake_harness(tmp_path)
    no_daemon = fake_docker(tmp_path, answers=False)
    with pytest.raises(SWEbenchSetupError) as failed:
        run_evaluation(PREDICTIONS[:1], dataset="d.parquet", run_id="r", python=str(python), docker=str(no_daemon))
    message = str(failed.value)
    assert "`" + str(no_daemon) + " info` failed" in message and "Cannot connect to the Docker daemon" in message
    assert "install Docker" in message and "DOCKER_HOST" in message
    assert harness_calls(python) == [], "the harness is not started"

    monkeypatch.setenv("AGL_DOCKER", "no-such-container-runtime")
    with pytest.raises(SWEbenchSetupError, match=r"`no-such-container-runtime` is not installed.*install Docker"):
        run_evaluation(PREDICTIONS[:1], dataset="d.parquet", run_id="r", python=str(python))

    monkeypatch.setenv("AGL_SWEBENCH_PYTHON", sys.executable)  # a Python without swebench
    with pytest.raises(SWEbenchSetupError, match=r"cannot import swebench.*AGL_SWEBENCH_PYTHON"):
        run_evaluation(PREDICTIONS[:1], dataset="d.parquet", run_id="r")


def test_a_harness_that_fails_says_so_with_its_output(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text('#!/bin/sh\n[ "$1" = -c ] && exit 0\necho "docker.errors.APIError: no space left" >&2\nexit 1\n')
    python.chmod(0o755)
    docker = fake_docker(tmp_path, answers=True)
    with pytest.raises(SWEbenchRunError, match=r"exited 1: docker\.errors.APIError: no space left"):
        run_evaluation(PREDICTIONS[:1], dataset="d.parquet", run_id="r", python=str(python), docker=str(docker))
