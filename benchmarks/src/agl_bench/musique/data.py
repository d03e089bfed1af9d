"""Loading MuSiQue: official MuSiQue-Ans JSONL rows → task inputs, and the paragraph corpus they retrieve from.

Files (in `<datasets root>/musique/`): `dev.jsonl` and `train.jsonl`, or the official release's
`musique_ans_v1.0_dev.jsonl` and `musique_ans_v1.0_train.jsonl` (what `agl bench data fetch musique` downloads);
official rows:
`id`, `paragraphs` [{idx, title, paragraph_text, is_supporting}], `question`, `question_decomposition`,
`answer`, `answer_aliases`, `answerable`) and `corpus.jsonl` (`id`, `title`, `text`), one pool of every
paragraph of both splits.

When `corpus.jsonl` is absent (e.g. a user points `--data` at the official files alone), the corpus is built
from the paragraphs of the split's own rows, deduplicated by title + text, with the same ids as the shipped
file (`p` + 12 hex of sha1(title + "\\n" + text)), and written once under `$AGL_CACHE_DIR/derived/musique/`
(default `~/.cache/agl`): task inputs travel to worker processes as JSON, so they carry the corpus's path, not
the passages.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agl_bench.datasets import DataError, read_jsonl, require_keys, task_folder
from agl_trainer.models import cache_dir as agl_cache_dir

NAME = "musique"
SPLITS = ("dev", "train")
CORPUS_FILE = "corpus.jsonl"
OFFICIAL_FILE = "musique_ans_v1.0_{split}.jsonl"
ROW_KEYS = ("id", "paragraphs", "question", "answer", "answer_aliases")
PARAGRAPH_KEYS = ("title", "paragraph_text")
CORPUS_KEYS = ("id", "title", "text")
_HOPS = re.compile(r"^(\d+)hop")


def cache_dir() -> Path:
    """Where the benchmark keeps what it derives from the data (built corpora, dense embeddings)."""
    # Not under bench/musique/: that folder is what `agl bench data fetch musique` owns and replaces whole.
    return agl_cache_dir() / "derived" / NAME


def passage_id(title: str, text: str) -> str:
    return "p" + hashlib.sha1(f"{title}\n{text}".encode()).hexdigest()[:12]


def hops_of(question_id: str) -> int | None:
    """The number of hops a MuSiQue id names (`2hop__…` → 2, `3hop1__…` → 3); None for other ids."""
    match = _HOPS.match(question_id)
    return int(match.group(1)) if match else None


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a MuSiQue JSONL file, checked for the fields the benchmark uses."""
    rows = read_jsonl(path, f"MuSiQue {path.stem} split")
    for lineno, row in enumerate(rows, 1):
        where = f"{path}: row {lineno}"
        require_keys(row, ROW_KEYS, where)
        for key in ("id", "question", "answer"):
            if not isinstance(row[key], str) or not row[key].strip():
                raise DataError(f"{where}: field {key} must be a non-empty string")
        aliases = row["answer_aliases"]
        if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
            raise DataError(f"{where}: field answer_aliases must be a list of strings")
        if not isinstance(row["paragraphs"], list):
            raise DataError(f"{where}: field paragraphs must be a list")
        for i, paragraph in enumerate(row["paragraphs"]):
            if not isinstance(paragraph, dict):
                raise DataError(f"{where}: paragraphs[{i}] must be an object")
            require_keys(paragraph, PARAGRAPH_KEYS, f"{where}, paragraphs[{i}]")
    return rows


def read_corpus_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a corpus file (`id`, `title`, `text`), checked."""
    rows = read_jsonl(path, "MuSiQue corpus")
    for lineno, row in enumerate(rows, 1):
        require_keys(row, CORPUS_KEYS, f"{path}: row {lineno}")
        if not all(isinstance(row[k], str) for k in CORPUS_KEYS):
            raise DataError(f"{path}: row {lineno}: fields id, title and text must be strings")
    if not rows:
        raise DataError(f"{path}: the corpus is empty")
    return rows


def corpus_from_rows(rows: Iterable[dict[str, Any]]) -> list[dict[str, str]]:
    """Every distinct paragraph of the rows, in first-seen order, as corpus rows."""
    seen: dict[str, dict[str, str]] = {}
    for row in rows:
        for paragraph in row["paragraphs"]:
            title, text = str(paragraph["title"]), str(paragraph["paragraph_text"])
            pid = passage_id(title, text)
            seen.setdefault(pid, {"id": pid, "title": title, "text": text})
    return list(seen.values())


def write_corpus(passages: list[dict[str, str]], folder: Path | None = None) -> Path:
    """Write a built corpus under the cache, named by its content (so equal corpora share one file)."""
    payload = "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in passages)
    digest = hashlib.sha256(payload.encode()).hexdigest()[:16]
    path = (folder or cache_dir() / "corpora") / f"corpus-{digest}.jsonl"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")  # written whole, then renamed: readers never see half
        tmp.write_text(payload, encoding="utf-8")
        tmp.replace(path)
    return path


def split_file(folder: Path, split: str) -> Path:
    """`<split>.jsonl` (the shared subset), else the official release's `musique_ans_v1.0_<split>.jsonl`."""
    for name in (f"{split}.jsonl", OFFICIAL_FILE.format(split=split)):
        if (folder / name).is_file():
            return folder / name
    raise DataError(
        f"MuSiQue {split} split not found: {folder / f'{split}.jsonl'} (or {OFFICIAL_FILE.format(split=split)})"
    )


def check(folder: Path) -> dict[str, int]:
    """Rows per split present in `folder` (a fetched `musique/`), every row checked."""
    counts: dict[str, int] = {}
    for split in SPLITS:
        try:
            path = split_file(folder, split)
        except DataError:
            continue
        counts[split] = len(read_rows(path))
    return counts


def task_input(row: dict[str, Any], corpus_path: Path) -> dict[str, Any]:
    answers = [row["answer"], *(a for a in row["answer_aliases"] if a != row["answer"])]
    return {
        "id": row["id"],
        "question": row["question"],
        "answers": answers,
        "corpus_path": str(corpus_path.resolve()),
        "hops": hops_of(row["id"]),
    }


def load(root: Path, split: str) -> list[dict[str, Any]]:
    """Task inputs of one split: `{id, question, answers, corpus_path, hops}` (answers[0] is the gold answer)."""
    if split not in SPLITS:
        raise DataError(f"MuSiQue has no split {split!r}; choose one of {', '.join(SPLITS)}")
    folder = task_folder(root, NAME)
    rows = read_rows(split_file(folder, split))
    corpus_path = folder / CORPUS_FILE
    if corpus_path.is_file():
        read_corpus_rows(corpus_path)  # fail here, at load time, rather than in every rollout
    else:
        corpus_path = write_corpus(corpus_from_rows(rows))
    return [task_input(row, corpus_path) for row in rows]
