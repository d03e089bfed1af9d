"""Grade SWE-bench predictions with the official harness, `swebench.harness.run_evaluation`, run as a program.

The harness builds a Docker image per instance, applies the patch, runs FAIL_TO_PASS and PASS_TO_PASS, and writes
a report; it needs a container runtime that answers (`docker info`) — this module checks for one first and says
what is missing. It runs with the Python of an environment that has `swebench` installed (apart from agl's own:
it brings `datasets`, `docker`, `modal`): `AGL_SWEBENCH_PYTHON`, else `.venv-harness/bin/python` (`make harnesses`
installs `swebench` there beside mini-swe-agent), found above the working folder or this file.

    python -m agl_bench.swebench.evaluate predictions.jsonl --dataset lite-test --run-id my-run

The command it runs (the argument names of swebench 5.0.2's `run_evaluation.py`):

    PYTHON -m swebench.harness.run_evaluation --dataset_name DATASET --split SPLIT --predictions_path P.jsonl
        --instance_ids ID... --run_id RUN --max_workers N --timeout S --report_dir DIR

DATASET is the parquet file the instances were loaded from when there is one (the harness reads a `.parquet`
path itself, so it grades the very rows the agent saw and needs no hub), else the hub name. The predictions are
JSON Lines in the official format: `instance_id`, `model_name_or_path`, `model_patch`. The harness writes
`DIR/<model_name_or_path with / as __>.<run_id>.json` (`resolved_ids`, `unresolved_ids`, `error_ids`,
`empty_patch_ids`, ...) and its logs under `logs/run_evaluation/` of the folder it runs in (`workdir`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PYTHON_ENV = "AGL_SWEBENCH_PYTHON"
DOCKER_ENV = "AGL_DOCKER"  # the container runtime's command (default `docker`; `podman` answers `info` too)
RESOLVED = "resolved"
# the report's lists, by what they say of an instance (an instance in none of them was not run)
STATUS_LISTS = {
    "resolved_ids": RESOLVED,
    "unresolved_ids": "unresolved",
    "empty_patch_ids": "empty_patch",
    "error_ids": "error",
    "incomplete_ids": "not_run",
}


class SWEbenchSetupError(RuntimeError):
    """What the official harness needs and this machine lacks (a container runtime, `swebench`), and how to give it."""


class SWEbenchRunError(RuntimeError):
    """The harness ran and failed, or wrote no report; the message holds the end of its output."""


@dataclass(frozen=True)
class Prediction:
    instance_id: str
    model_patch: str
    model_name_or_path: str = "agl"

    def to_json(self) -> dict[str, str]:
        return {
            "instance_id": self.instance_id,
            "model_name_or_path": self.model_name_or_path,
            "model_patch": self.model_patch,
        }


@dataclass(frozen=True)
class Grading:
    statuses: dict[str, str]  # instance_id → resolved | unresolved | empty_patch | error | not_run
    report: dict[str, Any]  # the harness's report as it wrote it
    report_path: Path
    command: list[str]

    def resolved(self, instance_id: str) -> bool:
        return self.statuses.get(instance_id) == RESOLVED


def write_predictions(predictions: Iterable[Prediction], path: Path) -> Path:
    """The predictions as JSON Lines in the official format (one model name for all: the harness's report is
    named after the first)."""
    rows = [p.to_json() for p in predictions]
    if not rows:
        raise ValueError("no predictions to write")
    if len({r["model_name_or_path"] for r in rows}) > 1:
        raise ValueError("predictions of one run must share model_name_or_path (the report is named after it)")
    if len({r["instance_id"] for r in rows}) != len(rows):
        raise ValueError("an instance_id appears twice in the predictions")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def read_predictions(path: Path) -> list[Prediction]:
    """Predictions from a `.jsonl` (or `.json` list) file in the official format; a later row of an instance wins."""
    text = path.read_text(encoding="utf-8")
    rows = json.loads(text) if path.suffix == ".json" else [json.loads(x) for x in text.splitlines() if x.strip()]
    found: dict[str, Prediction] = {}
    for index, row in enumerate(rows, 1):
        missing = [k for k in ("instance_id", "model_patch") if k not in row]
        if missing:
            raise ValueError(f"{path}: row {index}: missing {', '.join(missing)}")
        found[row["instance_id"]] = Prediction(
            row["instance_id"], row["model_patch"] or "", row.get("model_name_or_path") or "agl"
        )
    return list(found.values())


def swebench_python(explicit: str | None = None) -> str:
    """The Python that runs the harness: `explicit`, else AGL_SWEBENCH_PYTHON, else `.venv-harness/bin/python`."""
    if explicit:
        return explicit
    if os.environ.get(PYTHON_ENV):
        return os.environ[PYTHON_ENV]
    for start in (Path.cwd(), Path(__file__).resolve()):
        for folder in (start, *start.parents):
            if (found := folder / ".venv-harness" / "bin" / "python").exists():
                return str(found)
    raise SWEbenchSetupError(
        f"no Python with the `swebench` package: set {PYTHON_ENV} to one (pip install swebench), "
        "or run `make harnesses` (it installs swebench into .venv-harness)"
    )


def check_setup(python: str, *, docker: str | None = None, timeout_s: float = 60.0) -> None:
    """Raise SWEbenchSetupError unless `python` imports `swebench` and a container runtime answers `info`."""
    try:
        probe = subprocess.run([python, "-c", "import swebench"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SWEbenchSetupError(f"cannot run {python} ({exc}); set {PYTHON_ENV} to a Python with swebench") from exc
    if probe.returncode != 0:
        raise SWEbenchSetupError(
            f"{python} cannot import swebench ({_last_line(probe.stderr)}): `{python} -m pip install swebench`, "
            f"or set {PYTHON_ENV} to a Python that has it"
        )
    command = docker or os.environ.get(DOCKER_ENV) or "docker"
    how = (
        "the official SWE-bench harness builds and runs one Docker container per instance: install Docker "
        "(https://docs.docker.com/engine/install/) and start its daemon, or point DOCKER_HOST at one "
        f"(or {DOCKER_ENV} at another runtime's command); this check is `{command} info`"
    )
    if shutil.which(command) is None:
        raise SWEbenchSetupError(f"no container runtime: the command `{command}` is not installed; {how}")
    try:
        answer = subprocess.run([command, "info"], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise SWEbenchSetupError(f"`{command} info` did not answer in {timeout_s:g} s; {how}") from exc
    if answer.returncode != 0:
        said = _last_line(answer.stderr or answer.stdout)
        raise SWEbenchSetupError(f"the container runtime does not answer: `{command} info` failed ({said}); {how}")


def harness_command(
    python: str,
    *,
    dataset: str,
    split: str,
    predictions_path: Path,
    instance_ids: Sequence[str],
    run_id: str,
    max_workers: int,
    timeout_s: int,
    report_dir: Path,
) -> list[str]:
    """The official harness's command line (swebench 5.0.2's argument names)."""
    argv = [python, "-m", "swebench.harness.run_evaluation", "--dataset_name", dataset, "--split", split]
    argv += ["--predictions_path", str(predictions_path), "--instance_ids", *instance_ids]
    argv += ["--run_id", run_id, "--max_workers", str(max_workers), "--timeout", str(timeout_s)]
    argv += ["--report_dir", str(report_dir)]
    return argv


def run_evaluation(
    predictions: Sequence[Prediction],
    *,
    dataset: str,
    split: str = "test",
    run_id: str,
    workdir: Path | None = None,
    max_workers: int = 4,
    timeout_s: int = 1800,
    python: str | None = None,
    docker: str | None = None,
    harness_timeout_s: float | None = None,
) -> Grading:
    """Grade `predictions` with the official harness: each instance resolved, unresolved, or what went wrong.

    `dataset`: a parquet/JSON(L) file of the instances (`task["dataset_file"]`) or a hub name (then `split`).
    `workdir`: where the harness runs (its `logs/` and the report are kept there); default a temporary folder,
    deleted after. Raises SWEbenchSetupError before running anything when the harness cannot run here."""
    if not predictions:
        raise ValueError("no predictions to grade")
    python = swebench_python(python)
    check_setup(python, docker=docker)
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="agl-swebench-") as tmp:
            return _run(
                predictions, Path(tmp), dataset, split, run_id, max_workers, timeout_s, python, harness_timeout_s
            )
    return _run(predictions, workdir, dataset, split, run_id, max_workers, timeout_s, python, harness_timeout_s)


def _run(
    predictions: Sequence[Prediction],
    workdir: Path,
    dataset: str,
    split: str,
    run_id: str,
    max_workers: int,
    timeout_s: int,
    python: str,
    harness_timeout_s: float | None,
) -> Grading:
    workdir = workdir.resolve()
    path = write_predictions(predictions, workdir / f"predictions.{run_id}.jsonl")
    report_dir = workdir / "reports"
    ids = [p.instance_id for p in predictions]
    argv = harness_command(
        python,
        dataset=dataset,
        split=split,
        predictions_path=path,
        instance_ids=ids,
        run_id=run_id,
        max_workers=max_workers,
        timeout_s=timeout_s,
        report_dir=report_dir,
    )
    try:
        done = subprocess.run(argv, cwd=workdir, capture_output=True, text=True, timeout=harness_timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise SWEbenchRunError(f"the SWE-bench harness ran past {harness_timeout_s:g} s: {' '.join(argv)}") from exc
    (workdir / f"harness.{run_id}.log").write_text(done.stdout + done.stderr, encoding="utf-8")
    report_path = report_dir / f"{predictions[0].model_name_or_path.replace('/', '__')}.{run_id}.json"
    if done.returncode != 0 or not report_path.is_file():
        why = f"exited {done.returncode}" if done.returncode != 0 else f"wrote no report {report_path}"
        raise SWEbenchRunError(f"the SWE-bench harness {why}: {_tail(done.stdout + done.stderr, 2000)}")
    report = json.loads(report_path.read_text(encoding="utf-8"))
    return Grading(statuses=statuses(report, ids), report=report, report_path=report_path, command=argv)


def statuses(report: dict[str, Any], instance_ids: Iterable[str]) -> dict[str, str]:
    """Each instance's outcome in the harness's report; one it does not list was not run."""
    found = {iid: status for key, status in STATUS_LISTS.items() for iid in report.get(key) or []}
    return {iid: found.get(iid, "not_run") for iid in instance_ids}


def _last_line(text: str) -> str:
    lines = (text or "").strip().splitlines()
    return lines[-1] if lines else "no output"


def _tail(text: str, chars: int) -> str:
    text = (text or "").strip()
    return text if len(text) <= chars else "…" + text[-chars:]


def main(argv: Sequence[str] | None = None) -> int:
    from agl_bench.swebench.data import SPLIT_SOURCES

    parser = argparse.ArgumentParser(prog="python -m agl_bench.swebench.evaluate", description=__doc__.split("\n")[0])
    parser.add_argument("predictions", type=Path, help="JSON Lines in the official format (the agent's `predictions`)")
    parser.add_argument(
        "--dataset", required=True, help=f"a parquet file, a hub name, or one of {', '.join(SPLIT_SOURCES)}"
    )
    parser.add_argument("--data", default=None, help="datasets root when --dataset is a split name")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--workdir", type=Path, default=Path.cwd())
    parser.add_argument("--max-workers", type=int, default=4)
    parser.add_argument("--timeout", type=int, default=1800, help="seconds for one instance's tests")
    args = parser.parse_args(argv)
    dataset, split = args.dataset, "test"
    if dataset in SPLIT_SOURCES:
        from agl_bench.datasets import datasets_root
        from agl_bench.swebench.data import dataset_folder, split_files

        files = split_files(dataset_folder(datasets_root(args.data, SPLIT_SOURCES[dataset][0]), dataset), dataset)
        if len(files) > 1:
            parser.error(f"{dataset} has {len(files)} parquet shards; give the hub name instead")
        dataset, split = str(files[0]), SPLIT_SOURCES[args.dataset][2]
    try:
        grading = run_evaluation(
            read_predictions(args.predictions),
            dataset=dataset,
            split=split,
            run_id=args.run_id,
            workdir=args.workdir,
            max_workers=args.max_workers,
            timeout_s=args.timeout,
        )
    except (SWEbenchSetupError, SWEbenchRunError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    resolved = sum(1 for s in grading.statuses.values() if s == RESOLVED)
    for iid, status in grading.statuses.items():
        print(f"{iid}\t{status}")
    print(f"resolved {resolved} of {len(grading.statuses)}; report: {grading.report_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
