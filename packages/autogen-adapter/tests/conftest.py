"""Real `agl serve` + scripted upstream fixtures from agl-core; the example app is importable as a module."""

from __future__ import annotations

import sys
from pathlib import Path

from agl.testing.fixtures import *  # noqa: F403

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))
