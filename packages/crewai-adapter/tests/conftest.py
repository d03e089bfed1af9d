"""Shared set-up: CrewAI telemetry off, LiteLLM offline, agl's process fixtures, CrewAI instrumented per test."""

from __future__ import annotations

import os

# Before CrewAI is imported anywhere (worker processes inherit them too). Never OTEL_SDK_DISABLED: agl uses OTel.
os.environ["CREWAI_DISABLE_TELEMETRY"] = "true"
os.environ["CREWAI_TRACING_ENABLED"] = "false"
# Where litellm is installed: its model cost map from the package, not fetched from GitHub at import (offline
# that costs seconds of retries).
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from collections.abc import Iterator
from types import ModuleType

import pytest
from crewai_helpers import load_example

import agl_crewai


@pytest.fixture
def example() -> ModuleType:
    return load_example()


@pytest.fixture
def instrumented(example: ModuleType) -> Iterator[agl_crewai.AglListener]:
    """CrewAI instrumented for the test, and again after it (the example instruments it at import)."""
    listener = agl_crewai.instrument()
    yield listener
    agl_crewai.instrument()
