"""Calc-X rows (`id, question, chain, result, source`) from JSON Lines or parquet, as agent task inputs.

`<root>/calc_x/<split>.jsonl` is read, else `<split>.parquet`, else the hub's own shards
`data/<split>-*.parquet` (what `agl bench data fetch calc_x` downloads from MU-NLPC/Calc-X, whose rows carry
`source_ds` where the shared subset has `source`). Splits: `train` (300 rows) and `test` (200 rows) ship in the
shared data folder; the full collection has train 319k / validation 3.3k / test 6.1k. A task input is
`{"id", "question", "result"}` (`result`: the gold answer string).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agl_bench.datasets import DataError, read_jsonl, read_parquet, require_keys, task_folder

TASK_DIR = "calc_x"
SPLITS = ("train", "validation", "test")
FIELDS = ("id", "question", "chain", "result")  # `source` is always "calc": not needed, not required


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a `.jsonl` or `.parquet` file, each checked to have the Calc-X fields as strings."""
    rows = read_parquet(path, "Calc-X data file") if path.suffix == ".parquet" else read_jsonl(path, "Calc-X data file")
    for index, row in enumerate(rows, 1):
        where = f"{path}:{index}" if path.suffix != ".parquet" else f"{path}: row {index}"
        require_keys(row, FIELDS, where)
        for key in FIELDS:
            if not isinstance(row[key], str):
                raise DataError(f"{where}: field {key} must be a string, got {type(row[key]).__name__}")
        if not row["question"].strip() or not row["result"].strip():
            raise DataError(f"{where}: empty question or result")
    return rows


def split_files(folder: Path, split: str) -> list[Path]:
    """The file(s) of one split: `<split>.jsonl`, `<split>.parquet`, or the hub's shards in file-name order."""
    if split not in SPLITS:
        raise DataError(f"unknown Calc-X split {split!r}; choose one of {', '.join(SPLITS)}")
    for suffix in (".jsonl", ".parquet"):
        candidate = folder / f"{split}{suffix}"
        if candidate.is_file():
            return [candidate]
    shards = sorted((folder / "data").glob(f"{split}-*.parquet"))
    if shards:
        return shards
    raise DataError(
        f"Calc-X {split} split not found: {folder / f'{split}.jsonl'} (or .parquet, or data/{split}-*.parquet)"
    )


def task_input(row: dict[str, Any]) -> dict[str, Any]:
    return {"id": row["id"], "question": row["question"], "result": row["result"]}


def load(root: Path, split: str) -> list[dict[str, Any]]:
    """The task inputs of one split, in file order."""
    files = split_files(task_folder(root, TASK_DIR), split)
    return [task_input(row) for path in files for row in read_rows(path)]


def check(folder: Path) -> dict[str, int]:
    """Rows per split present in `folder` (a fetched `calc_x/`), every row checked."""
    counts: dict[str, int] = {}
    for split in SPLITS:
        try:
            files = split_files(folder, split)
        except DataError:
            continue  # a split the source does not have
        counts[split] = sum(len(read_rows(path)) for path in files)
    return counts
