"""Durable storage of tasks, rollouts, attempts, spans, LLM calls, rewards and model versions.

The parts, in the order data flows through them: `schema` (tables, versions, migrations), `ids`, `codec` (how
values are written into columns), `rows` (records ↔ rows), `writer` (the group-commit writer thread),
`records` and `lifecycle` (the writes, and the rollout/attempt state machine), `reads` (the queries), and
`store` (the `Store` facade over all of them).
"""

from agl.store.errors import ConflictError, NotFoundError, StoreError, StoreUnavailable
from agl.store.ids import new_id
from agl.store.schema import DB_FILENAME
from agl.store.store import Store

__all__ = ["Store", "StoreError", "NotFoundError", "ConflictError", "StoreUnavailable", "DB_FILENAME", "new_id"]
