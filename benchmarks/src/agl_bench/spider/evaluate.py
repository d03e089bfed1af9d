"""Execution accuracy for Spider: run the gold and the predicted SQL on the database and compare the results.

Safety: a predicted query is model output, so the database is opened read-only three times over: a
`file:...?mode=ro` URI (SQLite refuses to write the file), `PRAGMA query_only` (SQLite refuses data changes),
and an authorizer that allows only reading (SELECT, reading columns, functions, recursive CTEs) so that
`ATTACH`, `VACUUM INTO` (which writes a new file), `PRAGMA`, DDL and transactions are refused while the statement
is prepared. Each query runs under a wall-clock limit enforced by a progress handler (SQLite calls it every few
thousand VM steps and aborts the statement when it returns non-zero), and its result is capped in rows.

Comparison (as Spider's execution evaluation does it): the two results are equal when some order of the
predicted columns makes them equal as multisets of rows, or as lists when the gold query has a top-level
`ORDER BY`. Floats are compared to 10 significant digits (AVG vs SUM/COUNT may differ in the last bits);
integral floats equal ints. Two empty results are equal whatever their columns (the official rule).
A predicted query that fails, times out or returns too many rows scores 0.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_TIMEOUT_S = 5.0
MAX_ROWS = 100_000  # Spider's largest gold result has a few hundred rows; this only stops runaway joins
MAX_PERMUTATIONS = 2_000  # column orders tried before giving up on a wide result

Row = tuple[Any, ...]

_READ_ACTIONS = frozenset(
    {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
)
_PROGRESS_STEPS = 1_000


@dataclass(frozen=True)
class QueryResult:
    columns: tuple[str, ...]
    rows: list[Row]
    error: str | None = None  # None: the query ran to the end
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class ExecResult:
    score: float  # 1.0 when the predicted result equals the gold one, else 0.0
    error: str | None  # why the prediction could not be compared (it failed, timed out...), else None
    gold_rows: int
    pred_rows: int | None  # None when the predicted query did not run to the end

    @property
    def executable(self) -> bool:
        return self.pred_rows is not None


def _authorize(action: int, *_: Any) -> int:
    return sqlite3.SQLITE_OK if action in _READ_ACTIONS else sqlite3.SQLITE_DENY


def open_read_only(db_path: str | Path) -> sqlite3.Connection:
    """A connection that can only read `db_path` (see the module docstring)."""
    path = Path(db_path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"database not found: {path}")
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, check_same_thread=False)
    # Some Spider databases hold text that is not valid UTF-8: read it rather than fail the whole query.
    conn.text_factory = lambda b: b.decode("utf-8", errors="replace")
    conn.execute("PRAGMA query_only = ON")
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    conn.set_authorizer(_authorize)
    return conn


def run_query(
    db_path: str | Path, sql: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, max_rows: int = MAX_ROWS
) -> QueryResult:
    """Run one statement read-only under a time limit; failures come back as `error`, never raised."""
    sql = sql.strip().rstrip(";").strip()
    if not sql:
        return QueryResult((), [], "empty query")
    start = time.monotonic()
    deadline = start + timeout_s
    try:
        conn = open_read_only(db_path)
    except (OSError, sqlite3.Error) as exc:
        return QueryResult((), [], f"cannot open database: {exc}")
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline), _PROGRESS_STEPS)
    rows: list[Row] = []
    try:
        cursor = conn.execute(sql)
        columns = tuple(str(d[0]) for d in cursor.description or ())
        while batch := cursor.fetchmany(1_000):
            rows.extend(batch)
            if len(rows) > max_rows:
                return QueryResult(columns, [], f"more than {max_rows} rows", time.monotonic() - start)
    except (sqlite3.Error, sqlite3.Warning) as exc:
        elapsed = time.monotonic() - start
        if time.monotonic() > deadline and "interrupt" in str(exc):
            return QueryResult((), [], f"timed out after {timeout_s:g} s", elapsed)
        return QueryResult((), [], f"{type(exc).__name__}: {exc}", elapsed)
    finally:
        conn.close()
    return QueryResult(columns, rows, None, time.monotonic() - start)


# ------------------------------------------------------------------------------------------- comparison

_LITERAL_OR_COMMENT = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|`[^`]*`|\[[^\]]*\]|--[^\n]*|/\*.*?\*/", re.S)
_ORDER_BY = re.compile(r"\border\s+by\b", re.I)


def has_top_level_order_by(sql: str) -> bool:
    """True when the outermost query sorts its result (an ORDER BY inside a subquery does not count)."""
    text = _LITERAL_OR_COMMENT.sub(" ", sql)
    depth, outer = 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(depth - 1, 0)
        elif depth == 0:
            outer.append(ch)
    return _ORDER_BY.search("".join(outer)) is not None


def _normalise(value: Any) -> Any:
    if isinstance(value, float):
        if value.is_integer():
            return int(value)
        return float(f"{value:.10g}")
    return value


def _column_orders(candidates: Sequence[Sequence[int]]) -> Iterator[tuple[int, ...]]:
    """Assignments gold column i → a distinct predicted column from candidates[i] (identity tried first)."""
    chosen: list[int] = []
    used: set[int] = set()

    def extend(i: int) -> Iterator[tuple[int, ...]]:
        if i == len(candidates):
            yield tuple(chosen)
            return
        for j in candidates[i]:
            if j in used:
                continue
            chosen.append(j)
            used.add(j)
            yield from extend(i + 1)
            chosen.pop()
            used.discard(j)

    return extend(0)


def results_match(
    gold: Sequence[Row], pred: Sequence[Row], *, ordered: bool, max_permutations: int = MAX_PERMUTATIONS
) -> bool:
    """Whether `pred` equals `gold` up to the order of its columns (and of its rows unless `ordered`)."""
    if not gold and not pred:
        return True
    if len(gold) != len(pred):
        return False
    gold_rows = [tuple(_normalise(v) for v in row) for row in gold]
    pred_rows = [tuple(_normalise(v) for v in row) for row in pred]
    width = len(gold_rows[0])
    if any(len(row) != width for row in (*gold_rows, *pred_rows)):
        return False
    # A predicted column can stand for a gold column only if it holds the same multiset of values: this prunes
    # almost every permutation before any row is compared.
    gold_cols = [Counter(row[i] for row in gold_rows) for i in range(width)]
    pred_cols = [Counter(row[j] for row in pred_rows) for j in range(width)]
    candidates = [[j for j in range(width) if pred_cols[j] == gold_cols[i]] for i in range(width)]
    for i, options in enumerate(candidates):  # the columns' own order first: the usual case costs one comparison
        if i in options:
            options.remove(i)
            options.insert(0, i)
    gold_bag = None if ordered else Counter(gold_rows)
    for tried, order in enumerate(_column_orders(candidates)):
        if tried >= max_permutations:
            break
        permuted = [tuple(row[j] for j in order) for row in pred_rows]
        if permuted == gold_rows if gold_bag is None else Counter(permuted) == gold_bag:
            return True
    return False


def execution_accuracy(
    db_path: str | Path, gold_sql: str, pred_sql: str | None, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> ExecResult:
    """1.0 when `pred_sql` returns the same result as `gold_sql` on `db_path`, else 0.0 (with the reason)."""
    gold = run_query(db_path, gold_sql, timeout_s=timeout_s)
    if not gold.ok:
        return ExecResult(0.0, f"gold query failed: {gold.error}", 0, None)
    if pred_sql is None or not pred_sql.strip():
        return ExecResult(0.0, "no SQL query", len(gold.rows), None)
    pred = run_query(db_path, pred_sql, timeout_s=timeout_s)
    if not pred.ok:
        return ExecResult(0.0, pred.error, len(gold.rows), None)
    same = results_match(gold.rows, pred.rows, ordered=has_top_level_order_by(gold_sql))
    return ExecResult(1.0 if same else 0.0, None, len(gold.rows), len(pred.rows))


# ---------------------------------------------------------------------------------------- SQL extraction

_FENCE = re.compile(r"```[ \t]*(?:sqlite|sql)?[ \t]*\n?(.*?)(?:```|\Z)", re.S | re.I)
# Where a statement starts in free text. A lower-case "select" is only looked for when nothing else is found:
# it is also an English word ("to select the names, SELECT name FROM ...").
_STATEMENT_STARTS = (
    re.compile(r"\bSELECT\b"),
    re.compile(r"\bWITH\s+(?:RECURSIVE\s+)?\w+\s*(?:\([^)]*\))?\s+AS\s*\(", re.I),
    re.compile(
        r"\b(?:INSERT\s+(?:OR\s+\w+\s+)?INTO|REPLACE\s+INTO|UPDATE\s+\S+\s+SET|DELETE\s+FROM|DROP\s+(?:TABLE|VIEW|INDEX|"
        r"TRIGGER)|CREATE\s+(?:TEMP\w*\s+)?(?:TABLE|VIEW|INDEX|TRIGGER)|ALTER\s+TABLE|ATTACH\b|DETACH\b|PRAGMA\s+\w|"
        r"VACUUM\b)",
        re.I,
    ),
)
_WEAK_START = re.compile(r"\bselect\s+(?:distinct\s+)?(?:\*|[\w\"`\[(])", re.I)
_PREFIX = re.compile(r"^\s*(?:sql(?:\s+query)?|query|answer)\s*:\s*", re.I)


def _first_statement(text: str) -> str:
    """`text` up to its first `;` outside quotes, or its first blank line (prose after the query)."""
    quote: str | None = None
    for i, ch in enumerate(text):
        if quote is not None:
            if ch == quote:
                quote = None
        elif ch in "'\"`":
            quote = ch
        elif ch == ";" or (ch == "\n" and text[i + 1 : i + 2] == "\n"):
            return text[:i]
    return text


def extract_sql(answer: str) -> str | None:
    """The SQL statement in a model's answer (a ```sql block, else the first statement in the text), without
    trailing semicolons; None when there is none. Write statements are extracted too: they must reach the
    database to fail there (and be penalised), not be dropped silently."""
    blocks = [b.strip() for b in _FENCE.findall(answer) if b.strip()]
    text = blocks[0] if blocks else answer
    text = _PREFIX.sub("", text)
    starts = [m.start() for pattern in _STATEMENT_STARTS if (m := pattern.search(text))]
    if not starts and (weak := _WEAK_START.search(text)):
        starts = [weak.start()]
    if starts:
        text = text[min(starts) :]
    elif not blocks:
        return None
    sql = _first_statement(text).strip().rstrip(";").strip()
    return sql or None
