"""What the route modules (`routes_*.py`) need of the running server, as a protocol: the app registers them and
hands itself over, while they import only this, so that no module imports the app back."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

from agl.server.proxy import LLMProxy
from agl.server.settings import ServerSettings
from agl.store import Store

T = TypeVar("T")


class ServerContext(Protocol):
    """The server as its routes see it (`agl.server.app.Server` is one)."""

    settings: ServerSettings
    store: Store
    proxy: LLMProxy
    work_event: asyncio.Event | None

    async def written(self, fut: Future[T]) -> T:
        """The store writer's answer to a write, awaited without blocking the event loop."""
        ...

    def wake_workers(self) -> None:
        """End the long polls of workers waiting for a claim."""
        ...

    async def health(self) -> tuple[int, dict[str, Any]]:
        """(status, body) of `/healthz`."""
        ...
