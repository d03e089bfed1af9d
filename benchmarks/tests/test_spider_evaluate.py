"""Spider's execution-accuracy evaluator and SQL extraction, on the real databases and hand-made cases."""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import time
from contextlib import closing
from pathlib import Path

import pytest

from agl_bench.datasets import datasets_root
from agl_bench.spider.data import database_path, load
from agl_bench.spider.evaluate import (
    execution_accuracy,
    extract_sql,
    has_top_level_order_by,
    results_match,
    run_query,
)


@pytest.fixture(scope="module")
def spider_dir() -> Path:
    return datasets_root() / "spider"


@pytest.fixture(scope="module")
def concert(spider_dir: Path) -> Path:
    return database_path(spider_dir, "concert_singer")


def test_every_gold_query_scores_one_against_itself(spider_dir: Path) -> None:
    tasks = load(spider_dir.parent, "dev")
    assert len(tasks) == 688
    failures = []
    for task in tasks:
        outcome = execution_accuracy(task["db_path"], task["query"], task["query"])
        if outcome.score != 1.0 or outcome.error is not None or outcome.pred_rows != outcome.gold_rows:
            failures.append((task["id"], outcome))
    assert failures == []


def test_wrong_queries_score_zero(concert: Path) -> None:
    singers = "SELECT count(*) FROM singer"
    assert run_query(concert, singers).rows != run_query(concert, "SELECT count(*) FROM stadium").rows
    wrong = {
        "SELECT count(*) FROM stadium": None,  # another number
        "SELECT name FROM singer WHERE age > 40": None,  # fewer rows
        "SELECT name, age FROM singer": None,  # an extra column
        "SELECT nme FROM singer": "no such column",  # does not run
        "SELECT count(*) FROM singers": "no such table",
    }
    gold = {"SELECT count(*) FROM stadium": singers}
    for pred, error in wrong.items():
        outcome = execution_accuracy(concert, gold.get(pred, "SELECT name FROM singer"), pred)
        assert outcome.score == 0.0, pred
        if error is None:
            assert outcome.error is None and outcome.executable, pred
        else:
            assert outcome.error is not None and error in outcome.error and not outcome.executable, pred
    assert execution_accuracy(concert, singers, None).score == 0.0
    assert execution_accuracy(concert, singers, "  ").score == 0.0


def test_row_order_counts_only_when_the_gold_query_sorts(concert: Path) -> None:
    by_age = "SELECT name, country, age FROM singer ORDER BY age DESC"
    reversed_ = "SELECT name, country, age FROM singer ORDER BY age ASC"
    # the precondition: same rows, different order
    gold_rows, pred_rows = run_query(concert, by_age).rows, run_query(concert, reversed_).rows
    assert gold_rows != pred_rows and sorted(gold_rows) == sorted(pred_rows)
    assert execution_accuracy(concert, by_age, reversed_).score == 0.0

    unsorted = "SELECT name, country, age FROM singer"
    assert run_query(concert, unsorted).rows != run_query(concert, reversed_).rows
    assert execution_accuracy(concert, unsorted, reversed_).score == 1.0
    # an ORDER BY inside a subquery does not make the outer result ordered
    nested = "SELECT name FROM (SELECT name FROM singer ORDER BY age DESC LIMIT 3)"
    assert execution_accuracy(concert, nested, "SELECT name FROM singer ORDER BY age DESC LIMIT 3").score == 1.0


def test_column_order_does_not_count(concert: Path) -> None:
    gold = "SELECT name, country, age FROM singer ORDER BY age DESC"
    assert execution_accuracy(concert, gold, "SELECT age, name, country FROM singer ORDER BY age DESC").score == 1.0
    assert execution_accuracy(concert, gold, "SELECT country, age, name FROM singer ORDER BY age").score == 0.0


def test_results_match_by_hand() -> None:
    assert results_match([(1, "a"), (2, "b")], [("b", 2), ("a", 1)], ordered=False)
    assert not results_match([(1, "a"), (2, "b")], [("b", 2), ("a", 1)], ordered=True)
    assert results_match([(1, "a"), (2, "b")], [("a", 1), ("b", 2)], ordered=True)
    # column multisets agree but no single column order gives the same rows
    assert not results_match([(1, 2), (2, 1)], [(1, 1), (2, 2)], ordered=False)
    # duplicates are counted (multisets, not sets)
    assert not results_match([(1,), (1,), (2,)], [(1,), (2,), (2,)], ordered=False)
    # floats: tiny representation differences and integral floats are equal, real differences are not
    assert results_match([(1 / 3, 2.0)], [(0.1 / 0.3, 2)], ordered=False)
    assert not results_match([(0.5,)], [(0.50001,)], ordered=False)
    assert results_match([], [], ordered=True)
    assert not results_match([(1,)], [], ordered=False)
    assert not results_match([(1, 2)], [(1, 2, 3)], ordered=False)
    # two columns with identical values: both orders are candidates, one of them matches
    assert results_match([(1, 1, "x"), (2, 2, "y")], [("x", 1, 1), ("y", 2, 2)], ordered=True)


def test_top_level_order_by() -> None:
    assert has_top_level_order_by("SELECT a FROM t ORDER BY a")
    assert has_top_level_order_by("select a from t\norder\n by a desc limit 1")
    assert not has_top_level_order_by("SELECT a FROM (SELECT a FROM t ORDER BY a)")
    assert not has_top_level_order_by("SELECT a FROM t WHERE b = 'order by'")
    assert not has_top_level_order_by("SELECT a FROM t -- order by a")
    assert not has_top_level_order_by("SELECT border FROM t")


def test_a_query_that_runs_forever_times_out(concert: Path) -> None:
    forever = (
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 1000000000000) SELECT max(x) FROM c"
    )
    start = time.monotonic()
    outcome = execution_accuracy(concert, "SELECT count(*) FROM singer", forever, timeout_s=0.5)
    elapsed = time.monotonic() - start
    assert outcome.score == 0.0 and outcome.error is not None and "timed out" in outcome.error
    assert 0.5 <= elapsed < 2.0
    # a recursive query that ends is allowed
    assert run_query(concert, forever.replace("1000000000000", "10")).rows == [(10,)]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_generated_writes_leave_the_database_unchanged(concert: Path, tmp_path: Path) -> None:
    db = tmp_path / "concert_singer.sqlite"
    shutil.copyfile(concert, db)  # copyfile, not copy: the copy must be writable for the test to mean anything
    os.chmod(db, 0o644)
    assert os.access(db, os.W_OK)
    before = _sha256(db)
    gold = "SELECT count(*) FROM singer"
    writes = [
        "DROP TABLE singer",
        "UPDATE singer SET age = 0",
        "DELETE FROM singer",
        "INSERT INTO singer (Singer_ID, Name) VALUES (99, 'x')",
        "WITH s AS (SELECT 1) DELETE FROM singer",
        "CREATE TABLE extra (a)",
        "ALTER TABLE singer ADD COLUMN extra int",
        f"ATTACH DATABASE '{tmp_path / 'other.db'}' AS other",
        f"VACUUM INTO '{tmp_path / 'vacuumed.db'}'",
        "PRAGMA journal_mode = WAL",
        "SELECT count(*) FROM singer; DROP TABLE singer",
        "BEGIN",
    ]
    for sql in writes:
        outcome = execution_accuracy(db, gold, sql)
        assert outcome.score == 0.0 and outcome.error is not None, sql
    assert _sha256(db) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["concert_singer.sqlite"]
    # the same statements do change a database opened the ordinary way (so the checks above could fail)
    with closing(sqlite3.connect(db)) as conn:
        conn.execute("DELETE FROM singer")
        conn.commit()
    assert _sha256(db) != before


def test_extract_sql() -> None:
    assert extract_sql("```sql\nSELECT name FROM singer;\n```") == "SELECT name FROM singer"
    assert extract_sql("Here it is:\n```SQL\nSELECT a\nFROM t\n```\nThis lists a.") == "SELECT a\nFROM t"
    assert extract_sql("```sqlite\nSELECT 1;;\n```") == "SELECT 1"
    assert extract_sql("```sql SELECT count(*) FROM singer; ```") == "SELECT count(*) FROM singer"
    assert extract_sql("```sql\nSELECT name FROM singer WHERE age >") == "SELECT name FROM singer WHERE age >"
    assert extract_sql("SQL: SELECT a FROM t;") == "SELECT a FROM t"
    assert extract_sql("To select the names, use SELECT name FROM t; it works.") == "SELECT name FROM t"
    assert extract_sql("The query is select name from t where x = 'a;b';") == "select name from t where x = 'a;b'"
    assert extract_sql("SELECT a FROM t\n\nThis query returns a.") == "SELECT a FROM t"
    assert extract_sql("WITH c AS (SELECT 1) SELECT * FROM c") == "WITH c AS (SELECT 1) SELECT * FROM c"
    assert extract_sql("Answer with the query: DROP TABLE singer;") == "DROP TABLE singer"
    assert extract_sql("I do not know.") is None
    assert extract_sql("") is None
    assert extract_sql("```sql\n\n```") is None
