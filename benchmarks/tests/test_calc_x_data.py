"""The Calc-X loader: the real splits, parquet, and errors that name the file, line and field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agl_bench.calc_x.data import load, read_rows
from agl_bench.calc_x.task import TASK
from agl_bench.datasets import DataError, datasets_root


def _real_rows(n: int) -> list[dict[str, Any]]:
    lines = (datasets_root() / "calc_x" / "train.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines[:n]]


def _write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_real_splits() -> None:
    root = datasets_root()
    train, test = load(root, "train"), load(root, "test")
    assert (len(train), len(test)) == (300, 200)
    assert not {t["id"] for t in train} & {t["id"] for t in test}
    for task in train + test:
        assert set(task) == {"id", "question", "result"}
        assert all(isinstance(v, str) and v for v in task.values())
    assert TASK.load(root, "test") == test
    assert json.loads(json.dumps(test)) == test  # travels as JSON to the workers


def test_parquet_gives_the_same_tasks_as_jsonl(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = _real_rows(5)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "rows.parquet")
    assert read_rows(tmp_path / "rows.parquet") == rows
    folder = tmp_path / "calc_x"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), folder / "test.parquet")
    assert load(tmp_path, "test") == [{k: r[k] for k in ("id", "question", "result")} for r in rows]


def test_bad_parquet_is_a_data_error(tmp_path: Path) -> None:
    (tmp_path / "broken.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match=r"broken\.parquet: not a readable parquet file"):
        read_rows(tmp_path / "broken.parquet")
    with pytest.raises(DataError, match="not found"):
        read_rows(tmp_path / "absent.parquet")


def test_missing_folder_split_and_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no calc_x/ folder"):
        load(tmp_path, "train")
    (tmp_path / "calc_x").mkdir()
    with pytest.raises(DataError, match=r"train split not found: .*train\.jsonl"):
        load(tmp_path, "train")
    with pytest.raises(DataError, match="unknown Calc-X split 'dev'"):
        load(tmp_path, "dev")


def test_bad_json_line_names_file_and_line(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "calc_x" / "train.jsonl", _real_rows(2))
    path.write_text(path.read_text() + '{"id": "x", "question": \n', encoding="utf-8")
    with pytest.raises(DataError, match=r"train\.jsonl:3: not valid JSON"):
        load(tmp_path, "train")


def test_missing_field_names_it(tmp_path: Path) -> None:
    rows = _real_rows(3)
    del rows[1]["result"]
    _write_jsonl(tmp_path / "calc_x" / "train.jsonl", rows)
    with pytest.raises(DataError, match=r"train\.jsonl:2: missing field\(s\) result"):
        load(tmp_path, "train")


def test_result_must_be_a_string(tmp_path: Path) -> None:
    rows = _real_rows(2)
    rows[0]["result"] = 408
    _write_jsonl(tmp_path / "calc_x" / "test.jsonl", rows)
    with pytest.raises(DataError, match=r"test\.jsonl:1: field result must be a string, got int"):
        load(tmp_path, "test")
