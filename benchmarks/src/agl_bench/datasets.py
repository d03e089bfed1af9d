"""Where the benchmark data is, and reading it with errors that name the file and line.

A task's data is read from, in this order: `--data DIR` (a folder holding `spider/`, `musique/`, `calc_x/`, `quixbugs/`);
`$AGL_BENCH_DATA`; the cache that `agl bench data fetch TASK` fills from the official sources
(`~/.cache/agl/bench/`, used once the task has been fetched there); `../shared/datasets/` beside the checkout
(the project's own subsets, found by walking up from the working directory and from this file). Nothing is
ever copied into the repository.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agl_trainer.models import cache_dir

ENV_VAR = "AGL_BENCH_DATA"
MANIFEST = "SOURCE.json"  # written by `agl bench data fetch` once a task's data is complete and checked


class DataError(ValueError):
    """Benchmark data that is missing or malformed; the message names the file (and line) at fault."""


def fetch_root() -> Path:
    """Where `agl bench data fetch` puts the data: `$AGL_BENCH_DATA`, else `bench/` in agl's cache
    (`$AGL_CACHE_DIR`, default `~/.cache/agl`)."""
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR]).expanduser()
    return cache_dir() / "bench"


def shared_root() -> Path | None:
    """`../shared/datasets/` beside the checkout, when there is one."""
    for start in (Path.cwd(), Path(__file__).resolve()):
        for folder in (start, *start.parents):
            candidate = folder / "shared" / "datasets"
            if candidate.is_dir():
                return candidate
    return None


def datasets_root(explicit: str | Path | None = None, task: str | None = None) -> Path:
    """The folder holding `spider/`, `musique/`, `calc_x/`, `quixbugs/` (for `task`: one that holds that task's folder)."""
    if explicit is not None:
        root = Path(explicit).expanduser()
        if not root.is_dir():
            raise DataError(f"data folder {root} does not exist")
        return root
    if os.environ.get(ENV_VAR):
        root = fetch_root()
        if not root.is_dir():
            raise DataError(f"{ENV_VAR}={root} is not a folder (agl bench data fetch TASK fills it)")
        return root
    cache = fetch_root()
    if task is not None and (cache / task / MANIFEST).is_file():
        return cache
    shared = shared_root()
    if shared is not None and (task is None or (shared / task).is_dir()):
        return shared
    what = f"no {task} data" if task else "no benchmark data"
    raise DataError(
        f"{what} found: looked in {cache / (task or '')} and ../shared/datasets; run "
        f"`agl bench data fetch {task or 'TASK'}` to download it from its official source, or give --data DIR"
    )


def task_folder(root: Path, name: str) -> Path:
    """`root/name`, or `root` itself when the user pointed straight at the task's folder."""
    folder = root / name
    if folder.is_dir():
        return folder
    raise DataError(f"{root} has no {name}/ folder")


def require_file(path: Path, what: str) -> Path:
    if not path.is_file():
        raise DataError(f"{what} not found: {path}")
    return path


def read_jsonl(path: Path, what: str) -> list[dict[str, Any]]:
    """Rows of a JSON Lines file (blank lines skipped); every row must be a JSON object."""
    require_file(path, what)
    rows: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            rows.append(row)
    return rows


def read_parquet(path: Path, what: str, columns: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Rows of a parquet file that must hold `columns`; pyarrow is imported only when parquet is read."""
    require_file(path, what)
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types (ArrowInvalid, OSError) for unreadable files
        raise DataError(f"{path}: not a readable parquet file ({exc})") from None
    missing = [k for k in columns if k not in table.column_names]
    if missing:
        raise DataError(f"{path}: missing column(s) {', '.join(missing)} (has {', '.join(table.column_names)})")
    rows: list[dict[str, Any]] = table.to_pylist()
    return rows


def read_json(path: Path, what: str) -> Any:
    require_file(path, what)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None


def require_keys(row: dict[str, Any], keys: Iterable[str], where: str) -> None:
    missing = [k for k in keys if k not in row]
    if missing:
        raise DataError(f"{where}: missing field(s) {', '.join(missing)}")


def limit_rows(rows: list[dict[str, Any]], limit: int | None, seed: int = 0) -> list[dict[str, Any]]:
    """`limit` rows drawn with a fixed seed (the same rows every run), kept in file order. Drawn rather than the
    first ones because the files are grouped (Spider by database, Calc-X by source data set)."""
    if limit is not None and limit < 1:
        raise DataError(f"limit must be ≥ 1, got {limit}")
    if limit is None or limit >= len(rows):
        return rows
    chosen = sorted(random.Random(seed).sample(range(len(rows)), limit))
    return [rows[i] for i in chosen]
