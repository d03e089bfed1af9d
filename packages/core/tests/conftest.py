"""Fixtures shared by agl-core's tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agl.store import Store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A store in the test's own directory, closed afterwards."""
    s = Store(tmp_path)
    yield s
    s.close()
