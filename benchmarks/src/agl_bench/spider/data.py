"""Loading Spider (official formats) into task inputs, and the database-disjoint train / test partition.

Files read from `<datasets root>/spider/`: `dev.jsonl` (`id, db_id, question, query`; preferred) or else the
official `dev.json` (a list of rows with `db_id, question, query, ...`; ids are `spider_dev_NNNN` from the row's
index in that file, or its own `id` field when it has one), and `database/<db_id>/<db_id>.sqlite`. `tables.json`
is not needed: the schema shown to the model is read from each database itself.

Splits: `dev` is every question. Only dev data is available, so `train` and `test` partition it BY DATABASE:
`test` holds the questions on `TEST_DATABASES` (about a third of them), `train` all others, so the model is
evaluated on databases it never saw in training, as in Spider itself. A database not named in the list (data
added later) goes to `train`, so `test` never changes.

A task input is `{id, db_id, question, query, db_path, schema}` (`query` = the gold SQL, `db_path` absolute).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from agl_bench.datasets import DataError, read_json, read_jsonl, require_file, require_keys, task_folder
from agl_bench.spider.evaluate import open_read_only, run_query

SPLITS = ("dev", "train", "test")
# 226 of the 688 questions (33 %): a mix of sizes and difficulty (car_1 is one of the hardest dev databases).
TEST_DATABASES = frozenset({"car_1", "tvshow", "employee_hire_evaluation", "museum_visit", "battle_death"})

# The schema text is kept under SCHEMA_MAX_CHARS (≈ 1,000–1,300 tokens) so that a prompt holding it, the
# question, a query, its result and a review fits a small model's 8k context with room to answer. Every
# CREATE TABLE statement comes first (whitespace collapsed); example rows are added, table by table, only while
# they fit; a schema whose statements alone are too long is cut and marked as cut.
SCHEMA_MAX_CHARS = 4_000
CHECK_TIMEOUT_S = 60.0  # a gold query that runs longer than this on a fetched database means a broken copy
SCHEMA_EXAMPLE_ROWS = 2
_MAX_VALUE_CHARS = 40


def split_of(db_id: str) -> str:
    return "test" if db_id in TEST_DATABASES else "train"


def database_path(folder: Path, db_id: str) -> Path:
    return folder / "database" / db_id / f"{db_id}.sqlite"


def _text_field(row: dict[str, Any], key: str, where: str) -> str:
    value = row[key]
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{where}: field {key} must be a non-empty string")
    return value


def read_examples(folder: Path) -> list[dict[str, str]]:
    """The rows of dev.jsonl (or dev.json) as `{id, db_id, question, query}`, in file order."""
    jsonl = folder / "dev.jsonl"
    rows: list[dict[str, str]] = []
    if jsonl.is_file():
        for i, row in enumerate(read_jsonl(jsonl, "Spider questions"), 1):
            where = f"{jsonl} row {i}"
            require_keys(row, ("id", "db_id", "question", "query"), where)
            rows.append({k: _text_field(row, k, where) for k in ("id", "db_id", "question", "query")})
        return rows
    official = folder / "dev.json"
    require_file(official, "Spider questions (dev.jsonl or dev.json)")
    data = read_json(official, "Spider questions")
    if not isinstance(data, list):
        raise DataError(f"{official}: expected a JSON list of questions, got {type(data).__name__}")
    for i, row in enumerate(data):
        where = f"{official} item {i}"
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
        require_keys(row, ("db_id", "question", "query"), where)
        qid = row["id"] if isinstance(row.get("id"), str) else f"spider_dev_{i:04d}"
        rows.append({"id": qid, **{k: _text_field(row, k, where) for k in ("db_id", "question", "query")}})
    return rows


def _cell(value: Any) -> str:
    text = value.hex() if isinstance(value, bytes) else str(value)
    text = " ".join(text.split())
    return text if len(text) <= _MAX_VALUE_CHARS else text[: _MAX_VALUE_CHARS - 1] + "…"


def schema_text(db_path: Path, *, max_chars: int = SCHEMA_MAX_CHARS, example_rows: int = SCHEMA_EXAMPLE_ROWS) -> str:
    """CREATE TABLE statements of a database with a few example rows per table, at most `max_chars` long."""
    conn = open_read_only(db_path)
    try:
        tables = conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY rowid"
        ).fetchall()
        statements = [" ".join(str(sql).split()) + ";" for _, sql in tables]
        samples: list[str] = []
        for name, _ in tables:
            quoted = '"' + str(name).replace('"', '""') + '"'
            cursor = conn.execute(f"SELECT * FROM {quoted} LIMIT {int(example_rows)}")
            header = " | ".join(str(d[0]) for d in cursor.description or ())
            lines = [" | ".join(_cell(v) for v in row) for row in cursor.fetchall()]
            samples.append(f"/* {len(lines)} example rows:\n{header}\n" + "\n".join(lines) + "\n*/" if lines else "")
    finally:
        conn.close()
    text = "\n".join(statements)
    if len(text) > max_chars:
        marker = "\n-- (schema cut)"
        return text[: max_chars - len(marker)] + marker
    budget = max_chars - len(text)
    parts: list[str] = []
    for statement, sample in zip(statements, samples, strict=True):
        parts.append(statement)
        if sample and len(sample) + 1 <= budget:
            parts.append(sample)
            budget -= len(sample) + 1
    return "\n".join(parts)


def load(root: Path, split: str) -> list[dict[str, Any]]:
    """Task inputs of one split (see the module docstring)."""
    if split not in SPLITS:
        raise DataError(f"unknown Spider split {split!r}; choose one of {', '.join(SPLITS)}")
    folder = task_folder(root, "spider")
    examples = read_examples(folder)
    schemas: dict[str, str] = {}
    tasks: list[dict[str, Any]] = []
    for row in examples:
        db_id = row["db_id"]
        if db_id not in schemas:
            db_path = require_file(database_path(folder, db_id), f"database of {db_id} (question {row['id']})")
            try:
                schemas[db_id] = schema_text(db_path)
            except Exception as exc:
                raise DataError(f"{db_path}: cannot read the schema ({exc})") from None
        if split != "dev" and split_of(db_id) != split:
            continue
        db_path = database_path(folder, db_id).resolve()
        tasks.append({**row, "db_path": str(db_path), "schema": schemas[db_id]})
    return tasks


def check(folder: Path) -> dict[str, int]:
    """Every question of a fetched `spider/` has its database, each database passes SQLite's own check, and
    every gold query runs on it; returns the rows per split."""
    examples = read_examples(folder)
    for db_id in sorted({row["db_id"] for row in examples}):
        path = require_file(database_path(folder, db_id), f"database of {db_id}")
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            verdict = conn.execute("PRAGMA quick_check").fetchone()[0]
        except sqlite3.Error as exc:
            raise DataError(f"{path}: not a readable SQLite database ({exc})") from None
        finally:
            conn.close()
        if verdict != "ok":
            raise DataError(f"{path}: SQLite's quick_check says {verdict}")
    failed = [
        (row["id"], result.error)
        for row in examples
        if not (result := run_query(database_path(folder, row["db_id"]), row["query"], timeout_s=CHECK_TIMEOUT_S)).ok
    ]
    if failed:
        shown = "; ".join(f"{qid}: {error}" for qid, error in failed[:3])
        raise DataError(f"{len(failed)} of {len(examples)} gold queries fail on their database ({shown})")
    return {split: sum(1 for row in examples if split == "dev" or split_of(row["db_id"]) == split) for split in SPLITS}
