"""agl's plugin for vLLM's CPU backend: LoRA products grouped by adapter.

This folder is not part of the `agl_trainer` package: `agl_trainer.engines.vllm_server` puts it on the PYTHONPATH of the
vLLM server it starts on a CPU, where its `.dist-info` registers `register` as a `vllm.general_plugins` entry
point, which vLLM calls in every one of its processes (server, engine core, workers). It imports only vLLM, torch
and the standard library: vLLM's environment has no agl.

Why: vLLM's CPU backend applies LoRA with `torch_ops.bgmv_*`, which gather a copy of the adapter's matrices for
every token (`weights[token_indices]`: 400 × 576 × 16 floats per projection and layer for one prompt) before an
einsum. Measured on 2 cores with the bundled model (`benchmarks/perf/bench_vllm_cpu.py`): serving a rank-16
adapter halved generation throughput. Nearly every token of a batch uses the same adapter (or a handful: one per
trained agent), so the same product is one matrix multiplication per adapter present: the rows grouped by index,
each group times its adapter's matrix. Same indices, same arithmetic (an index of -1 picks the last slot, as
tensor indexing does in the original); only the gathered copies are gone.

Applied only on the CPU platform and to the vLLM release it was written against (`PATCHED_VERSIONS`); elsewhere
vLLM runs as it is (correct, slower on a CPU) and its log says so.
"""

from __future__ import annotations

from typing import Any

PATCHED_VERSIONS = ("0.32.",)


def _adapters(weights: Any) -> Any:
    return weights.squeeze(dim=1) if weights.dim() == 4 else weights  # (slots, out, in)


def _grouped_product(inputs: Any, weights: Any, indices: Any, dtype: Any) -> Any:
    """Row b of the result is inputs[b] @ weights[indices[b]].T: one matmul per distinct index."""
    import torch

    stacked = _adapters(weights)
    inputs = inputs.to(dtype=dtype)
    present = torch.unique(indices)
    if present.numel() == 1:
        return inputs @ stacked[present[0]].to(dtype=dtype).transpose(0, 1)
    out = inputs.new_empty((inputs.shape[0], stacked.shape[1]))
    for index in present.tolist():
        rows = indices == index
        out[rows] = inputs[rows] @ stacked[index].to(dtype=dtype).transpose(0, 1)
    return out


def bgmv_shrink(
    inputs: Any, lora_b_weights: Any, output_tensor: Any, lora_indices_tensor: Any, scaling: float = 1.0
) -> None:
    outputs = _grouped_product(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs[:]


def bgmv_expand(
    inputs: Any, lora_b_weights: Any, output_tensor: Any, lora_indices_tensor: Any, add_inputs: bool = True
) -> None:
    outputs = _grouped_product(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    limit = output_tensor.shape[0]
    if outputs.shape[0] == 1 and output_tensor.shape[0] != 1:
        limit = 1
    common_len = min(outputs.shape[1], output_tensor.shape[1])  # adapter and model may pad differently
    if add_inputs:
        output_tensor[:, :common_len] += outputs[:limit, :common_len]
    else:
        output_tensor[:, :common_len] = outputs[:limit, :common_len]


def bgmv_expand_slice(
    inputs: Any,
    lora_b_weights: Any,
    output_tensor: Any,
    lora_indices_tensor: Any,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = True,
) -> None:
    outputs = _grouped_product(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += outputs[:]
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = outputs[:]


REPLACEMENTS = {"bgmv_shrink": bgmv_shrink, "bgmv_expand": bgmv_expand, "bgmv_expand_slice": bgmv_expand_slice}


def patch_lora_ops() -> str:
    """Replace vLLM's CPU LoRA products where they are looked up; returns what was done, for the log."""
    import vllm
    from vllm.platforms import current_platform

    version = str(getattr(vllm, "__version__", "?"))
    if not current_platform.is_cpu():
        return f"agl: vLLM {version} on {current_platform.device_name}: its own LoRA kernels are used"
    if not version.startswith(PATCHED_VERSIONS):
        return f"agl: vLLM {version}: CPU LoRA ops left as they are (the grouped products are for {PATCHED_VERSIONS})"
    import vllm.lora.ops.torch_ops as package
    import vllm.lora.ops.torch_ops.lora_ops as ops
    import vllm.lora.punica_wrapper.punica_cpu as punica_cpu

    # lora_ops' sgmv_* call bgmv_* through the module's globals; the package and punica_cpu hold their own names
    for module in (ops, package, punica_cpu):
        for name, function in REPLACEMENTS.items():
            if hasattr(module, name):
                setattr(module, name, function)
    return f"agl: vLLM {version}: CPU LoRA products grouped by adapter (one matmul per adapter in a batch)"


_DONE: list[str] = []


def register() -> None:
    """vLLM's general-plugin hook, called once per process."""
    if not _DONE:
        _DONE.append(patch_lora_ops())
        print(_DONE[0], flush=True)  # vLLM's output goes to <run>/logs/vllm.log
