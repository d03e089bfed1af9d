"""The plan's vLLM servers: each server's exact command line and environment, per node.

A node runs one server over its vLLM GPUs (tensor parallel × data parallel, an API server per data-parallel rank),
except where LoRA adapters are loaded at run time with data parallelism: vLLM 0.32 refuses more than one API server
then, and one API process would carry every request of the node, so the node runs a server per data-parallel rank
(`vllm_server.split_per_gpu`), each on its own GPUs and port, behind agl's proxy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agl_trainer.model_shape import ModelShape
from agl_trainer.plan.layout import Layout
from agl_trainer.plan.tool_parsers import tool_parser

FREE_PORT = "<free port>"  # chosen when the server starts, on the machine that runs it


def planned_servers(
    req: Any,
    shape: ModelShape,
    layout: Layout,
    node_settings: Callable[[str], Any],
    renders: bool | None,
) -> dict[str, Any]:
    """`servers`: one entry per server (its node, its index on the node, its GPUs, argv and env); `per_node` and,
    when more than one, `why`. `node_settings(python)`: a node's VLLMSettings (plan.build.vllm_settings, given by
    the caller: this module is build's); `renders`: whether the model's template renders tools."""
    from agl_trainer.engines.vllm_server import (
        PER_GPU_WHY,
        VLLMNotFound,
        find_vllm_python,
        split_per_gpu,
        vllm_argv,
        vllm_env_changes,
    )

    assert layout.vllm is not None
    try:
        python = str(find_vllm_python(req.config.vllm_python))
    except VLLMNotFound:
        python = "python"  # on the machine that runs it: an environment with vllm (make vllm)
    node = node_settings(python)
    each = split_per_gpu(node)
    template = Path(req.config.run_dir) / "logs" / "vllm_chat_template.jinja" if renders is False else None
    parser = dataclasses.asdict(tool_parser(shape, template_renders_tools=renders))
    servers = [
        {
            "node": n,
            "server": i,
            "gpus": s.tensor_parallel * s.data_parallel if len(each) > 1 else layout.vllm.gpus_per_server,
            # the node's GPUs it runs on (CUDA_VISIBLE_DEVICES); None: every GPU the node gives vLLM
            "gpu_ids": None if s.gpu_ids is None else list(s.gpu_ids),
            "tool_parser": parser,
            "argv": vllm_argv(s, python, FREE_PORT, template),
            "env": vllm_env_changes(s),
        }
        for n in range(layout.vllm.nodes)
        for i, s in enumerate(each)
    ]
    out: dict[str, Any] = {"servers": servers, "per_node": len(each)}
    if len(each) > 1:
        out["why"] = PER_GPU_WHY
    return out
