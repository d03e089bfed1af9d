"""A train step's resource figures in metrics.jsonl: generation throughput always, peak GPU memory only on CUDA."""

from __future__ import annotations

import pytest
import torch

from agl_trainer.loop import resource_fields


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
