"""agl's vLLM plugin for the CPU (`agl_trainer/vllm_plugin/agl_vllm_cpu.py`): its grouped LoRA products give what
vLLM 0.32's `torch_ops.bgmv_*` give, i.e. each token's row times the matrix of the adapter its index names, which
those functions compute by gathering a matrix per token (the reference below). The plugin runs in vLLM's own
environment; its products need only torch, so they are checked here. That vLLM loads it and serves the trainer's
log-probs with it is checked against a real vllm-cpu server in tests/test_vllm_engine.py."""

from __future__ import annotations

import importlib.util
from types import ModuleType

import pytest
import torch

from agl_trainer.engines.vllm_server import CPU_PLUGIN_PATH


@pytest.fixture(scope="module")
def plugin() -> ModuleType:
    spec = importlib.util.spec_from_file_location("agl_vllm_cpu", CPU_PLUGIN_PATH / "agl_vllm_cpu.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gathered(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """The definition vLLM's CPU ops implement: out[b] = Σ_i inputs[b, i] · weights[indices[b], o, i]."""
    w = weights.squeeze(1) if weights.dim() == 4 else weights
    return torch.stack([w[int(k)] @ inputs[b] for b, k in enumerate(indices)])


def case(seed: int, tokens: int, slots: int, out: int, inner: int, four_d: bool) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    inputs = torch.randn(tokens, inner, generator=g)
    weights = torch.randn(slots, 1, out, inner, generator=g) if four_d else torch.randn(slots, out, inner, generator=g)
    return inputs, weights


@pytest.mark.parametrize("indices", [[0] * 7, [1, 0, 1, 1, -1, 0, 2], [-1] * 7, [2, 2, 0, 2, 2, 2, 2]])
@pytest.mark.parametrize("four_d", [False, True])
def test_shrink_is_the_gathered_product_scaled(plugin: ModuleType, indices: list[int], four_d: bool) -> None:
    inputs, weights = case(1, len(indices), 3, 16, 24, four_d)
    idx = torch.tensor(indices)
    out = torch.full((len(indices), 20), 7.0)  # wider than the rank: the columns past it are left alone
    plugin.bgmv_shrink(inputs, weights, out, idx, 0.5)
    torch.testing.assert_close(out[:, :16], 0.5 * gathered(inputs, weights, idx), rtol=1e-5, atol=1e-5)
    assert bool((out[:, 16:] == 7.0).all())


@pytest.mark.parametrize("add", [False, True])
def test_expand_adds_or_writes_the_gathered_product(plugin: ModuleType, add: bool) -> None:
    indices = torch.tensor([0, 1, 1, -1, 0])
    inputs, weights = case(2, 5, 2, 32, 16, False)
    start = torch.randn(5, 30, generator=torch.Generator().manual_seed(3))  # the model pads less than the adapter
    out = start.clone()
    plugin.bgmv_expand(inputs, weights, out, indices, add)
    expected = gathered(inputs, weights, indices)[:, :30] + (start if add else 0)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_expand_broadcasts_a_single_row_as_vllm_does(plugin: ModuleType) -> None:
    inputs, weights = case(4, 1, 2, 8, 4, False)
    out = torch.zeros(3, 8)
    plugin.bgmv_expand(inputs, weights, out, torch.tensor([1]), True)
    torch.testing.assert_close(out, gathered(inputs, weights, torch.tensor([1])).expand(3, 8), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("add", [False, True])
def test_expand_slice_fills_only_its_slice(plugin: ModuleType, add: bool) -> None:
    indices = torch.tensor([1, 0, 1, 1])
    inputs, weights = case(5, 4, 2, 6, 16, True)
    out = torch.ones(4, 20)
    plugin.bgmv_expand_slice(inputs, weights, out, indices, 8, 6, add)
    torch.testing.assert_close(out[:, 8:14], gathered(inputs, weights, indices) + (1.0 if add else 0.0))
    assert bool((out[:, :8] == 1).all()) and bool((out[:, 14:] == 1).all())


def test_the_result_keeps_the_output_dtype(plugin: ModuleType) -> None:
    inputs, weights = case(6, 3, 1, 8, 8, False)
    out = torch.zeros(3, 8, dtype=torch.bfloat16)
    plugin.bgmv_shrink(inputs, weights, out, torch.tensor([0, 0, 0]), 1.0)
    torch.testing.assert_close(out.float(), gathered(inputs, weights, torch.tensor([0, 0, 0])), rtol=2e-2, atol=2e-2)
