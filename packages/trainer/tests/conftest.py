"""A tiny randomly initialised Llama with the SmolLM2 tokenizer: the real code paths, in seconds."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agl_trainer.engines.embedded import Engine
from agl_trainer.models import build_tiny_llama, load_model

# Every Ray these tests start or join (local ones, and the two-node cluster of test_ray_placement) is a throw-away
# cluster on loopback, and all run in this one process: with token authentication on for the first (Ray 2.60's
# default) and off for another, the actors of the later clusters are cancelled before they run.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny(tiny_model_dir: Path) -> tuple[Any, Any]:
    return load_model(tiny_model_dir, device="cpu")


@pytest.fixture
def engine(tiny: tuple[Any, Any]) -> Iterator[Engine]:
    model, tokenizer = tiny
    eng = Engine(model, tokenizer, max_batch=8, batch_window_s=0.05).start()
    yield eng
    eng.close()
