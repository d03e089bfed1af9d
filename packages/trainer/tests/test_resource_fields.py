"""A train step's resource figures in metrics.jsonl: generation throughput always, peak GPU memory only on CUDA."""

from __future__ import annotations

import pytest
import torch

from agl_trainer.run.loop import resource_fields


def test_throughput_is_tokens_per_rollout_second_and_cpu_rows_have_no_gpu_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a CPU run on a machine with a GPU
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a, **k: 0)  # CUDA never used
    assert resource_fields(300, 2.0) == {"gen_tokens_per_s": 150.0}
    assert resource_fields(300, 0.0) == {}  # no division by a zero-length step


def test_cuda_rows_record_the_peak_allocated_memory_in_gib(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a, **k: 3 * 2**29)
    assert resource_fields(10, 1.0) == {"gen_tokens_per_s": 10.0, "gpu_peak_gib": 1.5}


def test_the_step_line_shows_the_importance_weights_only_when_the_correction_is_on() -> None:
    from agl_trainer.run.step_metrics import _importance_summary

    assert _importance_summary({"grad_norm/x": 1.0}) == ""
    line = _importance_summary({"is_weight_mean": 1.01, "is_weight_max": 3.2, "is_truncated_fraction": 0.02})
    assert line == "  IS weight mean 1.010 max 3.20 truncated 2.0%"
    assert _importance_summary({"is_weight_mean": 1.0, "is_weight_max": 1.5, "is_masked_fraction": 0.1}).endswith(
        "masked 10.0%"
    )
