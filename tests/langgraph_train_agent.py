"""The LangGraph writer → checker → rewriter example, with short answers and a reward a random tiny model can
earn by chance (so GRPO groups disagree and every step has something to learn): the training end-to-end test
runs it in worker processes as `tests/langgraph_train_agent.py:essay`."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from langchain_openai import ChatOpenAI

import agl
from agl_langchain import AglCallbackHandler

_EXAMPLE = (
    Path(__file__).resolve().parents[1] / "packages" / "langchain-adapter" / "examples" / "writer_checker_rewriter.py"
)


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("writer_checker_rewriter", _EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@agl.rollout
def essay(task: dict[str, Any], llm: agl.LLM) -> float:
    example = _example()
    model = ChatOpenAI(base_url=llm.base_url, api_key=llm.api_key, model=llm.model, max_tokens=5, max_retries=0)
    graph = example.build_graph(model)
    final = graph.invoke(example.essay_input(task), config={"callbacks": [AglCallbackHandler()]})
    return float(len(final["draft"]) % 2 == 0)
