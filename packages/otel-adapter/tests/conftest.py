"""Each test starts with agl_otel uninstrumented and no provider requested (the instrumentor is one per process)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import agl_otel


@pytest.fixture(autouse=True)
def uninstrumented() -> Iterator[None]:
    agl_otel.uninstrument()
    agl_otel.OTelInstrumentor().requested = None
    yield
    agl_otel.uninstrument()
    agl_otel.OTelInstrumentor().requested = None
