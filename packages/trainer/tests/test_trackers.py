"""Experiment trackers get the rows of metrics.jsonl, the curve and eval samples; read back with each library's
own reader (MLflow's client, TensorBoard's event accumulator, W&B's offline run files)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agl_trainer.config import parse_trackers
from agl_trainer.tracking.metrics import MetricsLog
from agl_trainer.tracking.trackers import metric_values, open_trackers

ROWS = [
    {"kind": "eval", "step": 0, "accuracy": 0.25, "n": 4, "reward_mean": 0.25, "elapsed_min": 0.1},
    {
        "kind": "train",
        "step": 0,
        "reward_mean": 0.4,
        "success_rate": 0.4,
        "loss": 0.12,
        "note": "text",
        "kl": float("nan"),
    },
    {"kind": "train", "step": 1, "reward_mean": 0.6, "success_rate": 0.5, "loss": 0.08, "note": "x", "kl": 0.01},
    {"kind": "eval", "step": 2, "accuracy": 0.75, "n": 4, "reward_mean": 0.7, "elapsed_min": 0.3},
]
SAMPLES = [{"rollout_id": "ro-1", "task": "2+3", "answer": "5", "reward": 1.0}]


def test_metric_values_keep_numbers_under_their_kind() -> None:
    assert metric_values(ROWS[1]) == {
        "train/reward_mean": 0.4,
        "train/success_rate": 0.4,
        "train/loss": 0.12,
    }  # no text, no NaN, no step
    assert metric_values({"kind": "eval", "step": 1, "ok": True}) == {}  # booleans are not metrics


def test_tracker_names_are_checked() -> None:
    assert parse_trackers("mlflow, TensorBoard,mlflow") == ("mlflow", "tensorboard")
    assert parse_trackers(None) == () and parse_trackers("") == ()
    with pytest.raises(ValueError, match=r"unknown tracker.*neptune.*choose from mlflow, tensorboard, wandb"):
        parse_trackers("mlflow,neptune")


def write_run(run_dir: Path, names: tuple[str, ...]) -> None:
    log = MetricsLog(run_dir, open_trackers(names, run_dir, "test-run", {"lr": 2e-4, "strategy": "uniform"}))
    for row in ROWS:
        log.write(row)
        if row["kind"] == "eval":
            log.samples(int(row["step"]), SAMPLES)
    log.plot()
    log.close()
    assert [json.loads(line)["step"] for line in log.path.read_text().splitlines()] == [0, 0, 1, 2]


@pytest.mark.slow
def test_mlflow_file_store_has_the_metrics_by_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlflow", reason="pip install 'agl-trainer[trackers]'")
    from mlflow import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    write_run(tmp_path, ("mlflow",))
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("agl").experiment_id])
    history = {k: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, k)] for k in run.data.metrics}
    assert history["train/reward_mean"] == [(0, 0.4), (1, 0.6)]
    assert history["eval/accuracy"] == [(0, 0.25), (2, 0.75)]
    assert "train/note" not in history and history["train/kl"] == [(1, 0.01)]
    assert run.data.params == {"lr": "0.0002", "strategy": "uniform"} and run.info.status == "FINISHED"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)} | {
        a.path for a in client.list_artifacts(run.info.run_id, "samples")
    }
    assert {"learning_curve.png", "samples/eval_step_0.json", "samples/eval_step_2.json"} <= artifacts


@pytest.mark.slow
def test_tensorboard_event_file_has_the_metrics_by_step(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="pip install 'agl-trainer[trackers]'")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    write_run(tmp_path, ("tensorboard",))
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    scalars = {tag: [(e.step, round(e.value, 6)) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert scalars["train/reward_mean"] == [(0, 0.4), (1, 0.6)]
    assert scalars["eval/accuracy"] == [(0, 0.25), (2, 0.75)]
    assert "learning_curve" in events.Tags()["images"]
    assert {"config/text_summary", "eval/samples/text_summary"} <= set(events.Tags()["tensors"])


@pytest.mark.slow
def test_wandb_runs_offline_without_an_account(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb", reason="pip install 'agl-trainer[trackers]'")
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    write_run(tmp_path, ("wandb",))
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    # the history itself is in the binary log `wandb sync` uploads later (W&B ships no reader for it); the media
    # logged with it are plain files
    (log_file,) = run_dir.glob("*.wandb")
    assert log_file.stat().st_size > 0
    tables = sorted((run_dir / "files" / "media" / "table" / "eval").glob("samples_*.table.json"))
    assert [t.name.split("_")[1] for t in tables] == ["0", "2"]  # one table per evaluation, by step
    table = json.loads(tables[0].read_text())
    assert table["columns"] == list(SAMPLES[0]) and table["data"] == [list(SAMPLES[0].values())]
    assert list((run_dir / "files" / "media" / "images").glob("learning_curve_*.png"))
