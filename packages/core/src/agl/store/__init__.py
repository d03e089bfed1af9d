"""Durable storage of tasks, rollouts, attempts, spans, LLM calls, rewards and model versions."""

from agl.store.errors import ConflictError, NotFoundError, StoreError
from agl.store.sqlite import DB_FILENAME, Store, new_id

__all__ = ["Store", "StoreError", "NotFoundError", "ConflictError", "DB_FILENAME", "new_id"]
