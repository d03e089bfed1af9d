"""Fixtures: agl-core's real `agl serve` + scripted upstream, the example app, and a one-rollout runner."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import agl
import agl_autogen
from agl.client import Client
from agl.common.processes import ServerProcess
from agl.schema import RolloutDetail

EXAMPLE_PATH = Path(__file__).resolve().parents[1] / "examples" / "calculator_team.py"
RunRollout = Callable[..., RolloutDetail]


@pytest.fixture(scope="session")
def example() -> ModuleType:
    """The example app, loaded from its file under a name no other package's example can clash with."""
    spec = importlib.util.spec_from_file_location("agl_autogen_example_calculator_team", EXAMPLE_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def instrumented() -> Iterator[None]:
    """Every test starts instrumented (as the example app leaves the process), whatever the last one did."""
    agl_autogen.instrument()
    yield
    agl_autogen.instrument()


@pytest.fixture
def run_rollout(agl_server: ServerProcess, agl_client: Client) -> RunRollout:
    """`run_rollout(app, task)`: one rollout of `app` in an in-process runner; its stored detail."""

    def run(app: Any, task: Any) -> RolloutDetail:
        (rollout,) = agl_client.enqueue(task)
        stats = agl.Runner(app, agl_server.url, concurrency=1, heartbeat_s=0.5).run(max_rollouts=1)
        detail = agl_client.rollout_detail(rollout.id)
        assert stats.succeeded == 1, (stats, detail.attempts)
        detail.llm_calls.sort(key=lambda call: call.seq)
        return detail

    return run
