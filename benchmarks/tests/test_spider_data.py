"""Spider's loader: the real data, the database-disjoint partition, the schema text, and errors in bad data."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from agl_bench.datasets import DataError, datasets_root
from agl_bench.spider.data import SCHEMA_MAX_CHARS, load, schema_text
from agl_bench.spider.task import TASK


@pytest.fixture(scope="module")
def root() -> Path:
    return datasets_root()


def test_dev_split_has_every_question_with_its_database(root: Path) -> None:
    tasks = load(root, "dev")
    assert len(tasks) == 688
    assert len({t["id"] for t in tasks}) == 688
    first = tasks[0]
    assert set(first) == {"id", "db_id", "question", "query", "db_path", "schema"}
    assert first["id"] == "spider_dev_0000" and first["db_id"] == "concert_singer"
    assert first["query"] == "SELECT count(*) FROM singer"
    json.dumps(tasks)  # task inputs travel as JSON
    for task in tasks:
        path = Path(task["db_path"])
        assert path.is_absolute() and path.is_file() and path.name == f"{task['db_id']}.sqlite"


def test_schema_text_shows_every_table_within_the_cap(root: Path) -> None:
    schemas = {t["db_id"]: (t["db_path"], t["schema"]) for t in load(root, "dev")}
    assert len(schemas) == 15
    for db_id, (db_path, schema) in schemas.items():
        assert len(schema) <= SCHEMA_MAX_CHARS, db_id
        with closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)) as conn:
            tables = [n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        assert tables and all(name in schema for name in tables), db_id
        assert schema.count("CREATE TABLE") == len([t for t in tables if not t.startswith("sqlite_")]), db_id
    # a small database also gets example rows (values from the database itself)
    concert = schemas["concert_singer"][1]
    assert "example rows" in concert and "Joe Sharp" in concert


def test_schema_text_cap(root: Path) -> None:
    db = root / "spider" / "database" / "concert_singer" / "concert_singer.sqlite"
    full = schema_text(db, max_chars=100_000)
    statements_only = schema_text(db, max_chars=100_000, example_rows=0)
    assert "example rows" in full and "example rows" not in statements_only
    # a budget the statements fit in but the rows do not: statements kept whole, rows dropped
    tight = schema_text(db, max_chars=len(statements_only) + 10)
    assert tight.count("CREATE TABLE") == 4 and len(tight) <= len(statements_only) + 10
    cut = schema_text(db, max_chars=300)
    assert len(cut) <= 300 and cut.endswith("(schema cut)")


def test_train_and_test_are_disjoint_by_database_and_stable(root: Path) -> None:
    dev = load(root, "dev")
    train, test = load(root, "train"), load(root, "test")
    train_dbs, test_dbs = {t["db_id"] for t in train}, {t["db_id"] for t in test}
    assert train_dbs and test_dbs and not train_dbs & test_dbs
    assert sorted(t["id"] for t in train + test) == sorted(t["id"] for t in dev)
    assert 0.25 <= len(test) / len(dev) <= 0.4
    # pinned: evaluation results are only comparable if the partition never moves
    assert test_dbs == {"car_1", "tvshow", "employee_hire_evaluation", "museum_visit", "battle_death"}
    assert len(test) == 226
    assert [t["id"] for t in load(root, "test")] == [t["id"] for t in test]
    assert TASK.load(root, TASK.eval_split) == test and TASK.train_split == "train"


# ----------------------------------------------------------------------------------------- bad data


def _tiny(tmp_path: Path, rows: list[str] | None = None, *, jsonl: bool = True) -> Path:
    """A Spider folder with one tiny database `tiny` and the given dev.jsonl lines."""
    folder = tmp_path / "spider"
    (folder / "database" / "tiny").mkdir(parents=True)
    with closing(sqlite3.connect(folder / "database" / "tiny" / "tiny.sqlite")) as conn:
        conn.execute("CREATE TABLE t (a int)")
        conn.execute("INSERT INTO t VALUES (1)")
        conn.commit()
    if jsonl:
        good = json.dumps({"id": "q1", "db_id": "tiny", "question": "How many?", "query": "SELECT count(*) FROM t"})
        (folder / "dev.jsonl").write_text("\n".join(rows if rows is not None else [good]) + "\n")
    return tmp_path


def test_a_tiny_folder_loads(tmp_path: Path) -> None:
    (task,) = load(_tiny(tmp_path), "dev")
    assert task["id"] == "q1" and "CREATE TABLE t" in task["schema"]
    assert task["db_path"] == str((tmp_path / "spider" / "database" / "tiny" / "tiny.sqlite").resolve())
    assert load(tmp_path, "train") == [task] and load(tmp_path, "test") == []


def test_official_dev_json_is_read_when_there_is_no_jsonl(tmp_path: Path) -> None:
    root = _tiny(tmp_path, jsonl=False)
    rows = [{"db_id": "tiny", "question": f"q{i}", "query": "SELECT a FROM t", "query_toks": []} for i in range(2)]
    (root / "spider" / "dev.json").write_text(json.dumps(rows))
    assert [t["id"] for t in load(root, "dev")] == ["spider_dev_0000", "spider_dev_0001"]

    (root / "spider" / "dev.json").write_text('[{"db_id": "tiny",')
    with pytest.raises(DataError, match=r"dev\.json:1: not valid JSON"):
        load(root, "dev")
    (root / "spider" / "dev.json").write_text('{"db_id": "tiny"}')
    with pytest.raises(DataError, match="expected a JSON list"):
        load(root, "dev")
    (root / "spider" / "dev.json").write_text('[{"db_id": "tiny", "question": "q"}]')
    with pytest.raises(DataError, match=r"dev.json item 0: missing field\(s\) query"):
        load(root, "dev")


def test_missing_files_and_bad_rows_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no spider/ folder"):
        load(tmp_path, "dev")

    root = _tiny(tmp_path / "a", jsonl=False)
    with pytest.raises(DataError, match=r"dev.jsonl or dev.json\) not found"):
        load(root, "dev")

    good = json.dumps({"id": "q1", "db_id": "tiny", "question": "How many?", "query": "SELECT 1"})
    root = _tiny(tmp_path / "b", [good, "{not json"])
    with pytest.raises(DataError, match=r"dev.jsonl:2: not valid JSON"):
        load(root, "dev")

    root = _tiny(tmp_path / "c", [json.dumps({"id": "q1", "db_id": "tiny", "question": "How many?"})])
    with pytest.raises(DataError, match=r"dev.jsonl row 1: missing field\(s\) query"):
        load(root, "dev")

    root = _tiny(tmp_path / "d", [json.dumps({"id": "q1", "db_id": "tiny", "question": "", "query": "SELECT 1"})])
    with pytest.raises(DataError, match="field question must be a non-empty string"):
        load(root, "dev")

    gone = json.dumps({"id": "q9", "db_id": "gone", "question": "?", "query": "SELECT 1"})
    root = _tiny(tmp_path / "e", [good, gone])
    with pytest.raises(DataError, match=r"database of gone \(question q9\) not found: .*gone/gone.sqlite"):
        load(root, "dev")

    root = _tiny(tmp_path / "f")
    (root / "spider" / "database" / "tiny" / "tiny.sqlite").write_bytes(b"not a database" * 100)
    with pytest.raises(DataError, match=r"tiny\.sqlite: cannot read the schema \(file is not a database\)"):
        load(root, "dev")
    with pytest.raises(DataError, match="unknown Spider split 'validation'"):
        load(root, "validation")
