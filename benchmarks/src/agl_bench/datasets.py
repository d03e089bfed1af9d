"""Where the benchmark data is, and reading it with errors that name the file and line.

The data is never copied into the repository: it is read from `../shared/datasets/` beside the checkout (found
by walking up from the working directory and from this file), from `$AGL_BENCH_DATA`, or from `--data DIR`.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ENV_VAR = "AGL_BENCH_DATA"


class DataError(ValueError):
    """Benchmark data that is missing or malformed; the message names the file (and line) at fault."""


def datasets_root(explicit: str | Path | None = None) -> Path:
    """The folder holding `spider/`, `musique/`, `calc_x/`."""
    if explicit is not None:
        root = Path(explicit).expanduser()
        if not root.is_dir():
            raise DataError(f"data folder {root} does not exist")
        return root
    if os.environ.get(ENV_VAR):
        root = Path(os.environ[ENV_VAR]).expanduser()
        if not root.is_dir():
            raise DataError(f"{ENV_VAR}={root} is not a folder")
        return root
    for start in (Path.cwd(), Path(__file__).resolve()):
        for folder in (start, *start.parents):
            candidate = folder / "shared" / "datasets"
            if candidate.is_dir():
                return candidate
    raise DataError(f"no benchmark data found: give --data DIR or set {ENV_VAR} (expected ../shared/datasets)")


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
