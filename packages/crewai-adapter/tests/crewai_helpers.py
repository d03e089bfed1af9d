"""Helpers for the agl-crewai tests: the example app as a module, and one rollout in an in-process runner."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from agl.client import Client
from agl.common.processes import ServerProcess
from agl.schema import RolloutDetail
from agl.testing import fixtures

EXAMPLE_PATH = Path(__file__).resolve().parents[1] / "examples" / "research_crew.py"


def load_example() -> ModuleType:
    """The example app as a module (importing it instruments CrewAI, as it would in a worker)."""
    if "research_crew" not in sys.modules:
        spec = importlib.util.spec_from_file_location("research_crew", EXAMPLE_PATH)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["research_crew"] = module
        spec.loader.exec_module(module)
    return sys.modules["research_crew"]


def run_one(app: Any, server: ServerProcess, client: Client, task: Any) -> RolloutDetail:
    """Run one rollout of `app` in an in-process runner; its stored detail."""
    return fixtures.run_one(app, server, client, task)
