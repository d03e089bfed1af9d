"""The store's file: its tables, its connection settings, its version and the migrations between versions."""

from __future__ import annotations

import sqlite3
from pathlib import Path

DB_FILENAME = "agl.sqlite"
SCHEMA_VERSION = 11
# How to bring a store written by an older agl up to date, step by step; applied once, in one transaction, when
# the store is opened (data already stored is kept).
MIGRATIONS: dict[int, tuple[str, ...]] = {
    # 1 → 2: per-agent policies (model versions name the backend model each agent's calls go to)
    1: ("ALTER TABLE model_versions ADD COLUMN agent_models TEXT",),
    # 2 → 3: the sampling temperature of each LLM call (the trainer computes log-probs at that temperature)
    2: ("ALTER TABLE llm_calls ADD COLUMN temperature REAL",),
    # 3 → 4: token ids and log-probs of LLM calls are written as binary BLOBs (agl.store.codec), not JSON text.
    # Nothing is rewritten: SQLite is dynamically typed, so rows written as JSON text stay where they are and
    # the decoder reads both, and opening a big store never copies its whole history. The version still moves,
    # so an older agl refuses the store instead of misreading the BLOBs.
    3: (),
    # 4 → 5: an LLM call's agent key (a stable second name of its agent, see agl.agent)
    4: ("ALTER TABLE llm_calls ADD COLUMN agent_key TEXT",),
    # 5 → 6: a prompt may be stored as the ids it adds to an earlier call's (agl.store.prompt_bases). Rows
    # already written keep their whole prompts (no base); the version moves so an older agl refuses the store
    # instead of reading a prompt's tail as the whole prompt.
    5: (
        "ALTER TABLE llm_calls ADD COLUMN prompt_base_seq INTEGER",
        "ALTER TABLE llm_calls ADD COLUMN prompt_base_len INTEGER",
    ),
    # 6 → 7: a succeeded attempt's calls and rewards are also packed into one row for the training read
    # (agl.store.attempt_packs; the table is created with the others). Attempts that succeeded before stay
    # unpacked and are read from their rows; the version moves so an older agl, which would not pack again what it
    # adds to a packed attempt, refuses the store.
    6: (),
    # 7 → 8: the route a call came in by (`chat` or `responses`); calls stored before came in by the chat route
    # (the Responses API was translated without a trace of it)
    7: ("ALTER TABLE llm_calls ADD COLUMN route TEXT NOT NULL DEFAULT 'chat'",),
    # 8 → 9: LLM calls an attempt sent elsewhere than agl, as its runner reported them (and the latest on its rollout)
    8: (
        "ALTER TABLE attempts ADD COLUMN bypassed_llm_calls INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE attempts ADD COLUMN bypassed_llm_url TEXT",
        "ALTER TABLE attempts ADD COLUMN external_llm_calls INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE rollouts ADD COLUMN bypassed_llm_calls INTEGER NOT NULL DEFAULT 0",
    ),
    # 9 → 10: the engine that answered an LLM call, where the proxy routes over several (calls stored before
    # name none)
    9: ("ALTER TABLE llm_calls ADD COLUMN engine TEXT",),
    # 10 → 11: what became of the calls that bypassed agl: answered there, or refused (the rest never reached a
    # server); NULL for attempts reported before, or by an older runner
    10: (
        "ALTER TABLE attempts ADD COLUMN bypassed_llm_answered INTEGER",
        "ALTER TABLE attempts ADD COLUMN bypassed_llm_refused INTEGER",
    ),
}

# Each table's columns in the field order of its model (agl.schema), so a row selected with these names maps
# onto the model by position. Every statement names its columns: a column added by a migration lands last in
# an old store but may sit elsewhere in a new one.
TASK_COLUMNS = ("id", "input", "metadata", "created_at")
ROLLOUT_COLUMNS = (
    "id",
    "task_id",
    "mode",
    "step",
    "status",
    "attempt_count",
    "max_attempts",
    "timeout_s",
    "created_at",
    "started_at",
    "ended_at",
    "final_attempt_id",
    "final_reward",
    "error",
    "metadata",
    "bypassed_llm_calls",
)
ATTEMPT_COLUMNS = (
    "id",
    "rollout_id",
    "number",
    "worker_id",
    "status",
    "started_at",
    "heartbeat_at",
    "lease_expires_at",
    "ended_at",
    "error",
    "bypassed_llm_calls",
    "bypassed_llm_url",
    "external_llm_calls",
    "bypassed_llm_answered",
    "bypassed_llm_refused",
)
SPAN_COLUMNS = (
    "trace_id",
    "span_id",
    "parent_id",
    "name",
    "kind",
    "start_time",
    "end_time",
    "attributes",
    "status",
    "status_message",
    "events",
    "rollout_id",
    "attempt_id",
    "agent_name",
    "source",
)
LLM_CALL_COLUMNS = (
    "id",
    "rollout_id",
    "attempt_id",
    "seq",
    "agent_name",
    "attribution",
    "trace_id",
    "parent_span_id",
    "model_requested",
    "model",
    "model_version",
    "request",
    "response_message",
    "prompt_ids",
    "response_ids",
    "logprobs",
    "finish_reason",
    "stream",
    "status",
    "http_status",
    "error",
    "started_at",
    "latency_s",
    "usage",
    "trainable",
    "not_trainable_reason",
    "temperature",
    "agent_key",
    "route",
    "engine",
)
# how a call's prompt is stored (agl.store.prompt_bases): read and written after LLM_CALL_COLUMNS, never part of
# the model
PROMPT_BASE_COLUMNS = ("prompt_base_seq", "prompt_base_len")
REWARD_COLUMNS = (
    "rollout_id",
    "attempt_id",
    "value",
    "name",
    "source",
    "after_llm_seq",
    "span_id",
    "agent_name",
    "timestamp",
    "metadata",
    "uid",
    "id",
)
MODEL_VERSION_COLUMNS = ("name", "upstream_model", "agent_models", "metadata", "version", "created_at")

DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tasks (
  id TEXT PRIMARY KEY, input TEXT NOT NULL, metadata TEXT NOT NULL, created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS rollouts (
  id TEXT PRIMARY KEY, task_id TEXT NOT NULL REFERENCES tasks(id), mode TEXT NOT NULL, step INTEGER,
  status TEXT NOT NULL, attempt_count INTEGER NOT NULL, max_attempts INTEGER NOT NULL, timeout_s REAL,
  created_at REAL NOT NULL, started_at REAL, ended_at REAL, final_attempt_id TEXT, final_reward REAL,
  error TEXT, metadata TEXT NOT NULL, bypassed_llm_calls INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS rollouts_status ON rollouts(status, created_at);
CREATE INDEX IF NOT EXISTS rollouts_task ON rollouts(task_id);
-- newest-first pages of the dashboard's rollouts table (agl.server.dashboard.queries)
CREATE INDEX IF NOT EXISTS rollouts_created ON rollouts(created_at);
CREATE TABLE IF NOT EXISTS attempts (
  id TEXT PRIMARY KEY, rollout_id TEXT NOT NULL REFERENCES rollouts(id), number INTEGER NOT NULL,
  worker_id TEXT NOT NULL, status TEXT NOT NULL, started_at REAL NOT NULL, heartbeat_at REAL NOT NULL,
  lease_expires_at REAL NOT NULL, ended_at REAL, error TEXT, bypassed_llm_calls INTEGER NOT NULL DEFAULT 0,
  bypassed_llm_url TEXT, external_llm_calls INTEGER NOT NULL DEFAULT 0, bypassed_llm_answered INTEGER,
  bypassed_llm_refused INTEGER);
CREATE INDEX IF NOT EXISTS attempts_rollout ON attempts(rollout_id);
CREATE INDEX IF NOT EXISTS attempts_lease ON attempts(status, lease_expires_at);
CREATE TABLE IF NOT EXISTS spans (
  trace_id TEXT NOT NULL, span_id TEXT NOT NULL, parent_id TEXT, name TEXT NOT NULL, kind TEXT NOT NULL,
  start_time REAL NOT NULL, end_time REAL NOT NULL, attributes TEXT NOT NULL, status TEXT NOT NULL,
  status_message TEXT, events TEXT NOT NULL, rollout_id TEXT, attempt_id TEXT, agent_name TEXT,
  source TEXT NOT NULL, PRIMARY KEY (trace_id, span_id));
CREATE INDEX IF NOT EXISTS spans_rollout ON spans(rollout_id);
CREATE TABLE IF NOT EXISTS llm_calls (
  id TEXT PRIMARY KEY, rollout_id TEXT NOT NULL, attempt_id TEXT NOT NULL, seq INTEGER NOT NULL,
  agent_name TEXT, attribution TEXT NOT NULL, trace_id TEXT, parent_span_id TEXT, model_requested TEXT,
  model TEXT, model_version INTEGER, request TEXT NOT NULL, response_message TEXT, prompt_ids BLOB,
  response_ids BLOB, logprobs BLOB, finish_reason TEXT, stream INTEGER NOT NULL, status TEXT NOT NULL,
  http_status INTEGER NOT NULL, error TEXT, started_at REAL NOT NULL, latency_s REAL NOT NULL,
  usage TEXT NOT NULL, trainable INTEGER NOT NULL, not_trainable_reason TEXT, temperature REAL, agent_key TEXT,
  prompt_base_seq INTEGER, prompt_base_len INTEGER, route TEXT NOT NULL DEFAULT 'chat', engine TEXT,
  UNIQUE (attempt_id, seq));
CREATE INDEX IF NOT EXISTS llm_calls_rollout ON llm_calls(rollout_id, attempt_id, seq);
CREATE TABLE IF NOT EXISTS rewards (
  id INTEGER PRIMARY KEY AUTOINCREMENT, rollout_id TEXT NOT NULL, attempt_id TEXT NOT NULL,
  value REAL NOT NULL, name TEXT NOT NULL, source TEXT NOT NULL, after_llm_seq INTEGER, span_id TEXT,
  agent_name TEXT, timestamp REAL NOT NULL, metadata TEXT NOT NULL, uid TEXT UNIQUE);
CREATE INDEX IF NOT EXISTS rewards_rollout ON rewards(rollout_id);
-- agl.store.attempt_packs: calls and rewards are JSON arrays, ids int32 and log-probs float64 (agl.common.packed)
CREATE TABLE IF NOT EXISTS attempt_packs (
  attempt_id TEXT PRIMARY KEY, rollout_id TEXT NOT NULL, calls BLOB NOT NULL, rewards BLOB NOT NULL,
  ids BLOB NOT NULL, logprobs BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS model_versions (
  version INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, upstream_model TEXT,
  metadata TEXT NOT NULL, created_at REAL NOT NULL, agent_models TEXT);
"""


# Indexes on columns that migrations add, so created after them. Only indexes: a store that has them still opens
# with the agl before them, which keeps them up to date without using them.
INDEXES = """
-- agl.store.prompt_bases: an attempt's latest call stored whole, found in one step however many calls name it
-- as their base (walking back over them made each insert O(calls in the attempt))
CREATE INDEX IF NOT EXISTS llm_calls_bases ON llm_calls(attempt_id, seq) WHERE prompt_base_seq IS NULL;
"""


def columns(names: tuple[str, ...], alias: str = "") -> str:
    """`a, b, c` (or `x.a, x.b, x.c`), for a SELECT that maps onto a model by position."""
    prefix = f"{alias}." if alias else ""
    return ", ".join(prefix + name for name in names)


def insert_sql(table: str, names: tuple[str, ...], *, verb: str = "INSERT") -> str:
    return f"{verb} INTO {table} ({columns(names)}) VALUES ({', '.join('?' * len(names))})"


def connect(path: Path) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit) that any thread may use; its rows are
    `sqlite3.Row`s (bulk reads ask their cursors for plain tuples, see agl.store.reads)."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
    conn.execute("PRAGMA journal_mode=WAL")
    # NORMAL keeps every commit durable against a crash of this process (the WAL is written before the
    # commit returns); only an OS crash or power loss can drop the last commits.
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.row_factory = sqlite3.Row
    return conn


def migrate(conn: sqlite3.Connection, path: Path | str = "the store") -> None:
    """Create what is missing and bring an older store up to SCHEMA_VERSION; refuse a newer one."""
    conn.executescript(DDL)
    row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    if row is None:
        conn.execute("INSERT INTO meta(key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        conn.executescript(INDEXES)
        return
    found = int(row[0])
    if found > SCHEMA_VERSION:
        raise RuntimeError(
            f"{path} has store schema version {found}, newer than this agl's {SCHEMA_VERSION}: upgrade agl"
        )
    if found < SCHEMA_VERSION:
        conn.execute("BEGIN IMMEDIATE")
        try:
            for version in range(found, SCHEMA_VERSION):
                for statement in MIGRATIONS[version]:
                    conn.execute(statement)
            conn.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),))
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    conn.executescript(INDEXES)
