"""SWE-bench Lite and Verified instances, read from the hub's parquet files as agent task inputs.

`agl bench data fetch swebench` keeps princeton-nlp/SWE-bench_Lite as the hub holds it in `<root>/swebench/`,
and `swebench_verified` keeps princeton-nlp/SWE-bench_Verified in `<root>/swebench_verified/` (see
`agl_bench.sources`). A split's rows are read from that folder's `data/<split>-*.parquet` shards (the hub's own
layout for these repositories), else `<split>.parquet` (the layout the `swebench` package's own
`write_parquets` and `load_swebench_dataset` use for a local folder). Splits: `lite-test` (300 instances),
`lite-dev` (23), `verified-test` (500). A Verified folder placed by hand may also sit at `<root>/swebench/verified/`.

Each row must carry `FIELDS` as the official dataset does (strings; FAIL_TO_PASS and PASS_TO_PASS are JSON lists
of test names kept as strings, or lists). A task input holds those fields (the two test lists decoded), `id`
(= instance_id), `hints_text`, and where it came from: `dataset` (the hub name), `split`, `dataset_file` (the
parquet file, absolute: `evaluate` hands it to the official harness, so it grades the very rows the agent saw,
without the hub). The gold `patch` and `test_patch` are not put in the task input: the agent must not see them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agl_bench.datasets import DataError, read_parquet

# split → (the task's data folder under the datasets root, the dataset's name on the hub, the hub's split)
SPLIT_SOURCES: dict[str, tuple[str, str, str]] = {
    "lite-test": ("swebench", "princeton-nlp/SWE-bench_Lite", "test"),
    "lite-dev": ("swebench", "princeton-nlp/SWE-bench_Lite", "dev"),
    "verified-test": ("swebench_verified", "princeton-nlp/SWE-bench_Verified", "test"),
}
SPLITS = tuple(SPLIT_SOURCES)
FIELDS = (
    "instance_id",
    "repo",
    "base_commit",
    "problem_statement",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
    "version",
    "environment_setup_commit",
)
TEST_LISTS = ("FAIL_TO_PASS", "PASS_TO_PASS")


def dataset_folder(root: Path, split: str) -> Path:
    """The folder holding `split`'s files under the datasets root."""
    if split not in SPLIT_SOURCES:
        raise DataError(f"unknown SWE-bench split {split!r}; choose one of {', '.join(SPLITS)}")
    name = SPLIT_SOURCES[split][0]
    candidates = [root / name]
    if name == "swebench_verified":
        candidates.append(root / "swebench" / "verified")
    for folder in candidates:
        if folder.is_dir():
            return folder
    fetch = "agl bench data fetch " + ("swebench" if name == "swebench" else "swebench_verified (fetch.fetch)")
    raise DataError(f"SWE-bench data for {split} not found: no {' or '.join(map(str, candidates))} ({fetch})")


def split_files(folder: Path, split: str) -> list[Path]:
    """The parquet file(s) of one split in `folder`: the hub's `data/<split>-*.parquet` shards, else `<split>.parquet`."""
    hub_split = SPLIT_SOURCES[split][2]
    shards = sorted((folder / "data").glob(f"{hub_split}-*.parquet"))
    if shards:
        return shards
    single = folder / f"{hub_split}.parquet"
    if single.is_file():
        return [single]
    raise DataError(
        f"SWE-bench {split} split not found: no {folder / 'data' / f'{hub_split}-*.parquet'} (nor {single})"
    )


def _test_list(value: Any, where: str, key: str) -> list[str]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: field {key} is not a JSON list of test names ({exc.msg})") from None
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise DataError(f"{where}: field {key} must be a list of test names, got {type(value).__name__}")
    return list(value)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of one parquet file, each checked to hold the SWE-bench fields (the test lists decoded)."""
    rows = read_parquet(path, "SWE-bench data file", FIELDS)
    seen: set[str] = set()
    for index, row in enumerate(rows, 1):
        where = f"{path}: row {index}" + (f" ({row['instance_id']})" if isinstance(row["instance_id"], str) else "")
        for key in FIELDS:
            if key in TEST_LISTS:
                row[key] = _test_list(row[key], where, key)
            elif not isinstance(row[key], str) or not row[key].strip():
                raise DataError(f"{where}: field {key} must be a non-empty string, got {row[key]!r:.60}")
        if not row["FAIL_TO_PASS"]:
            raise DataError(f"{where}: FAIL_TO_PASS is empty (no test would show the issue resolved)")
        if row["instance_id"] in seen:
            raise DataError(f"{where}: instance_id {row['instance_id']} appears twice")
        seen.add(row["instance_id"])
    return rows


def task_input(row: dict[str, Any], split: str, path: Path) -> dict[str, Any]:
    _, dataset, hub_split = SPLIT_SOURCES[split]
    return {
        "id": row["instance_id"],
        **{key: row[key] for key in FIELDS},
        "hints_text": row.get("hints_text") or "",
        "dataset": dataset,
        "split": hub_split,
        "dataset_file": str(path.resolve()),
    }


def load(root: Path, split: str) -> list[dict[str, Any]]:
    """The task inputs of one split, in file order."""
    folder = dataset_folder(root, split)
    return [task_input(row, split, path) for path in split_files(folder, split) for row in read_rows(path)]


def _check(folder: Path, splits: tuple[str, ...]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for split in splits:
        try:
            files = split_files(folder, split)
        except DataError:
            continue  # a split the source does not have
        counts[split] = sum(len(read_rows(path)) for path in files)
    return counts


def check(folder: Path) -> dict[str, int]:
    """Rows per split in `folder` (a fetched `swebench/`, SWE-bench Lite), every row checked."""
    return _check(folder, ("lite-dev", "lite-test"))


def check_verified(folder: Path) -> dict[str, int]:
    """Rows per split in `folder` (a fetched `swebench_verified/`), every row checked."""
    return _check(folder, ("verified-test",))
