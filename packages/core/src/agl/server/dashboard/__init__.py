"""The run dashboard `agl serve` shows at `/ui` (read-only), and the JSON API its pages read.

Registered on the server's FastAPI app by `add_routes`; it sits behind the same guards as every other route.
"""

from __future__ import annotations

from typing import Any


def add_routes(app: Any, server: Any) -> None:
    """Add the dashboard's pages and API routes to `app` (`server`: the `agl.server.app.Server` serving it)."""
