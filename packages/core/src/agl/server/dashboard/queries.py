"""The dashboard's reads: a filtered, paged rollouts table and the run's counts, in SQL on the store's file.

Pages are keyset-paged (`WHERE (created_at, rowid) < (last seen)`, newest first), never `OFFSET`, so page 2,000
of 100,000 rollouts costs what page 1 does; the status filter uses the store's (status, created_at) index. Each
request opens its own read-only connection: WAL lets it read beside the store's writer, and nothing here can
write.
"""

from __future__ import annotations

import math
import re
import sqlite3
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PAGE_SIZE = 50


@dataclass(frozen=True)
class RolloutFilter:
    status: str | None = None
    mode: str | None = None
    step: int | None = None
    agent: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None

    def where(self) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        args: list[Any] = []
        for column, value in (("r.status", self.status), ("r.mode", self.mode), ("r.step", self.step)):
            if value is not None:
                clauses.append(f"{column} = ?")
                args.append(value)
        if self.min_reward is not None:
            clauses.append("r.final_reward >= ?")
            args.append(self.min_reward)
        if self.max_reward is not None:
            clauses.append("r.final_reward <= ?")
            args.append(self.max_reward)
        if self.agent is not None:
            # the store's llm_calls(rollout_id, ...) index answers this per rollout; LIMIT stops the scan early
            clauses.append("EXISTS (SELECT 1 FROM llm_calls c WHERE c.rollout_id = r.id AND c.agent_name = ?)")
            args.append(self.agent)
        return (" WHERE " + " AND ".join(clauses) if clauses else ""), args


@dataclass(frozen=True)
class RolloutRow:
    id: str
    status: str
    mode: str
    step: int | None
    attempts: int
    reward: float | None
    created_at: float
    started_at: float | None
    ended_at: float | None
    error: str | None
    cursor: str  # where the next page starts after this row


@dataclass(frozen=True)
class Page:
    rows: list[RolloutRow]
    total: int
    next_cursor: str | None


def connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10, check_same_thread=False)


def _cursor(created_at: float, rowid: int) -> str:
    return f"{created_at!r}:{rowid}"


# ASCII digits only: Python's int() and float() also read other scripts' digits ("１２" is 12)
_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_INT64 = (-(2**63), 2**63 - 1)


def parse_int64(name: str, value: str) -> int:
    """A whole number SQLite can compare with (64 bits), written in ASCII digits; else ValueError naming it."""
    text = value.strip()
    if not _INT.fullmatch(text) or not _INT64[0] <= int(text) <= _INT64[1]:
        raise ValueError(f"{name} must be a whole number between -2**63 and 2**63-1, got {value[:40]!r}")
    return int(text)


def parse_float(name: str, value: str) -> float:
    """A finite number written in ASCII; else ValueError naming it."""
    text = value.strip()
    if not _FLOAT.fullmatch(text) or not math.isfinite(float(text)):
        raise ValueError(f"{name} must be a finite number, got {value[:40]!r}")
    return float(text)


def _parse_cursor(cursor: str) -> tuple[float, int]:
    created, _, rowid = cursor.rpartition(":")
    try:
        return parse_float("created", created), parse_int64("rowid", rowid)
    except ValueError:
        raise ValueError(f"not a page cursor: {cursor[:80]!r}") from None


def _row(row: tuple[Any, ...]) -> RolloutRow:
    rid, status, mode, step, attempts, reward, created, started, ended, error, rowid = row
    return RolloutRow(
        rid, status, mode, step, attempts, reward, created, started, ended, error, _cursor(created, rowid)
    )


def rollouts_page(path: Path, flt: RolloutFilter, *, after: str | None = None, size: int = PAGE_SIZE) -> Page:
    where, args = flt.where()
    with closing(connect(path)) as conn:
        total = int(conn.execute(f"SELECT COUNT(*) FROM rollouts r{where}", args).fetchone()[0])
        page_args = list(args)
        if after is not None:
            created, rowid = _parse_cursor(after)
            where += (" AND " if where else " WHERE ") + "(r.created_at, r.rowid) < (?, ?)"
            page_args += [created, rowid]
        found = conn.execute(
            "SELECT r.id, r.status, r.mode, r.step, r.attempt_count, r.final_reward, r.created_at, r.started_at,"
            f" r.ended_at, r.error, r.rowid FROM rollouts r{where} ORDER BY r.created_at DESC, r.rowid DESC LIMIT ?",
            [*page_args, size + 1],
        ).fetchall()
    rows = [_row(row) for row in found[:size]]
    return Page(rows, total, rows[-1].cursor if len(found) > size else None)


def overview(path: Path) -> dict[str, Any]:
    """Counts for the run overview: rollouts by status and mode, LLM calls by attribution, model versions."""
    with closing(connect(path)) as conn:
        by_status = dict(conn.execute("SELECT status, COUNT(*) FROM rollouts GROUP BY status").fetchall())
        by_mode = dict(conn.execute("SELECT mode, COUNT(*) FROM rollouts GROUP BY mode").fetchall())
        calls = dict(conn.execute("SELECT attribution, COUNT(*) FROM llm_calls GROUP BY attribution").fetchall())
        untrainable = conn.execute("SELECT COUNT(*) FROM llm_calls WHERE trainable = 0").fetchone()[0]
        steps = conn.execute("SELECT MAX(step) FROM rollouts").fetchone()[0]
        versions = conn.execute(
            "SELECT version, name, upstream_model, created_at FROM model_versions ORDER BY version DESC LIMIT 20"
        ).fetchall()
        attempts = conn.execute(
            "SELECT worker_id, status, COUNT(*) FROM attempts GROUP BY worker_id, status"
        ).fetchall()
    return {
        "rollouts_by_status": by_status,
        "rollouts_by_mode": by_mode,
        "rollouts": sum(by_status.values()),
        "llm_calls_by_attribution": calls,
        "llm_calls": sum(calls.values()),
        "untrainable_calls": int(untrainable),
        "last_step": steps,
        "model_versions": [{"version": v, "name": n, "upstream_model": u, "created_at": t} for v, n, u, t in versions],
        "workers_by_node": workers_by_node(attempts),
    }


def workers_by_node(attempts: list[tuple[str, str, int]]) -> list[dict[str, Any]]:
    """(worker id, attempt status, count) rows → per node (a worker id's part before its pid and random suffix,
    agl.capture.runner.RunnerOptions): its workers and their attempts claimed, running, finished and failed."""
    nodes: dict[str, dict[str, Any]] = {}
    for worker, status, count in attempts:
        node = worker.rsplit("-", 2)[0] if worker.count("-") >= 2 else worker
        row = nodes.setdefault(
            node, {"node": node, "workers": set(), "claimed": 0, "running": 0, "finished": 0, "failed": 0}
        )
        row["workers"].add(worker)
        row["claimed"] += count
        key = {"running": "running", "succeeded": "finished"}.get(status, "failed")
        row[key] += count
    return [{**row, "workers": len(row["workers"])} for _, row in sorted(nodes.items())]


def agents(path: Path, limit: int = 200) -> list[str]:
    """The agent names LLM calls were stored under (for the table's agent filter)."""
    with closing(connect(path)) as conn:
        found = conn.execute(
            "SELECT DISTINCT agent_name FROM llm_calls WHERE agent_name IS NOT NULL ORDER BY agent_name LIMIT ?",
            (limit,),
        ).fetchall()
    return [str(row[0]) for row in found]
