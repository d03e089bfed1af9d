"""Experiment trackers (`agl train --log-to mlflow,tensorboard,wandb`): the rows of metrics.jsonl, the learning
curve and a table of sample rollouts per evaluation, each written through the tracker's own library.

Each library is an optional extra (`pip install "agl-trainer[trackers]"`) imported only when asked for; a missing
one is a clear error before training starts. Everything is written under the run directory by default
(`mlruns/`, `tensorboard/`, `wandb/`), so a laptop run needs no server and no account (W&B runs offline unless
`WANDB_MODE` says otherwise).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

_PACKAGES = {"mlflow": "mlflow-skinny", "tensorboard": "tensorboard", "wandb": "wandb"}
_MODULES = {"mlflow": "mlflow", "tensorboard": "torch.utils.tensorboard", "wandb": "wandb"}


class Tracker(Protocol):
    def log_row(self, row: Mapping[str, Any]) -> None: ...
    def log_curve(self, png: Path, step: int) -> None: ...
    def log_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None: ...
    def close(self) -> None: ...


def metric_values(row: Mapping[str, Any]) -> dict[str, float]:
    """`{"kind": "train", "step": 3, "reward_mean": 0.5, ...}` → `{"train/reward_mean": 0.5, ...}`: the numbers
    of a metrics row under its kind, without the step itself and without text, None, NaN or infinity."""
    kind = str(row.get("kind", "train"))
    out: dict[str, float] = {}
    for key, value in row.items():
        if key in ("kind", "step") or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(value):
            out[f"{kind}/{key}"] = float(value)
    return out


def check_installed(names: Sequence[str]) -> None:
    """A clear error naming the pip line for every requested tracker whose library is missing."""
    import importlib.util

    missing = []
    for name in names:
        top = _MODULES[name].split(".")[0]
        if importlib.util.find_spec(top) is None or (name == "tensorboard" and not _has("tensorboard")):
            missing.append(name)
    if missing:
        pkgs = " ".join(_PACKAGES[n] for n in missing)
        raise ValueError(
            f"--log-to {','.join(missing)} needs {pkgs}: pip install {pkgs} (or pip install 'agl-trainer[trackers]')"
        )


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


class MlflowTracker:
    """One MLflow run per training run, in `MLFLOW_TRACKING_URI` or else `<run_dir>/mlruns` (a file store)."""

    def __init__(self, run_dir: Path, run_name: str, params: Mapping[str, Any]) -> None:
        from mlflow import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if uri is None:
            # a file store beside the run needs no server or database; MLflow 3 asks for this opt-in to use one
            uri = (run_dir / "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME", "agl")
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
        for key, value in params.items():
            self.client.log_param(self.run_id, key, str(value)[:6000])  # MLflow's limit on a value

    def log_row(self, row: Mapping[str, Any]) -> None:
        step = int(row.get("step", 0))
        for key, value in metric_values(row).items():
            self.client.log_metric(self.run_id, key, value, step=step)

    def log_curve(self, png: Path, step: int) -> None:
        self.client.log_artifact(self.run_id, str(png))

    def log_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        self.client.log_dict(self.run_id, {"step": step, "rollouts": list(samples)}, f"samples/eval_step_{step}.json")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class TensorBoardTracker:
    """TensorBoard event files in `<run_dir>/tensorboard`, written by torch's SummaryWriter."""

    def __init__(self, run_dir: Path, run_name: str, params: Mapping[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        self.writer.add_text("config", _markdown_table([{"option": k, "value": v} for k, v in params.items()]), 0)

    def log_row(self, row: Mapping[str, Any]) -> None:
        step = int(row.get("step", 0))
        for key, value in metric_values(row).items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()  # readable while the run trains

    def log_curve(self, png: Path, step: int) -> None:
        import matplotlib.image

        self.writer.add_image("learning_curve", matplotlib.image.imread(png), step, dataformats="HWC")

    def log_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        self.writer.add_text("eval/samples", _markdown_table(samples), step)

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """A W&B run; offline in `<run_dir>/wandb` unless WANDB_MODE is set (then as the user configured W&B)."""

    def __init__(self, run_dir: Path, run_name: str, params: Mapping[str, Any]) -> None:
        import wandb

        mode = os.environ.get("WANDB_MODE", "offline")
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "agl"),
            name=run_name,
            dir=str(run_dir),
            mode=mode,  # type: ignore[arg-type]
            config=dict(params),
            reinit="create_new",
        )

    def log_row(self, row: Mapping[str, Any]) -> None:
        self.run.log(metric_values(row), step=int(row.get("step", 0)))

    def log_curve(self, png: Path, step: int) -> None:
        import wandb

        self.run.log({"learning_curve": wandb.Image(str(png))}, step=step)

    def log_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        import wandb

        if not samples:
            return
        names = list(samples[0])
        columns: list[str | int] = list(names)
        table = wandb.Table(columns=columns, data=[[_cell(s.get(c)) for c in names] for s in samples])
        self.run.log({"eval/samples": table}, step=step)

    def close(self) -> None:
        self.run.finish()


_CLASSES: dict[str, type[Any]] = {"mlflow": MlflowTracker, "tensorboard": TensorBoardTracker, "wandb": WandbTracker}


def open_trackers(names: Sequence[str], run_dir: Path, run_name: str, params: Mapping[str, Any]) -> list[Tracker]:
    """The trackers asked for, each with the run's parameters logged; closes those opened if one fails."""
    check_installed(names)
    opened: list[Tracker] = []
    try:
        for name in names:
            opened.append(_CLASSES[name](run_dir, run_name, params))
    except BaseException:
        for tracker in opened:
            tracker.close()
        raise
    return opened


def _cell(value: Any) -> Any:
    return value if value is None or isinstance(value, str | int | float | bool) else str(value)


def _markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
    if not rows:
        return "(none)"
    columns = list(rows[0])

    def cell(v: Any) -> str:
        return str(_cell(v)).replace("|", "\\|").replace("\n", " ")[:200]

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)
