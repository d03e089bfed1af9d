"""MuSiQue loading: the real files, the corpus built from rows when none is given, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from musique_support import musique_row, write_jsonl

from agl_bench.datasets import DataError, datasets_root, read_jsonl
from agl_bench.musique.data import corpus_from_rows, hops_of, load, passage_id
from agl_bench.musique.task import TASK


@pytest.fixture(scope="module")
def real() -> Path:
    return datasets_root() / "musique"


def test_real_splits_become_task_inputs(real: Path) -> None:
    dev = load(real.parent, "dev")
    rows = read_jsonl(real / "dev.jsonl", "dev")
    assert len(dev) == len(rows) == 150
    assert len(load(real.parent, "train")) == 100
    for task, row in zip(dev, rows, strict=True):
        assert task["id"] == row["id"] and task["question"] == row["question"]
        assert task["answers"][0] == row["answer"]
        assert set(task["answers"]) == {row["answer"], *row["answer_aliases"]}
        assert task["hops"] == int(row["id"][0])
        assert Path(task["corpus_path"]).is_absolute()
        assert Path(task["corpus_path"]) == (real / "corpus.jsonl").resolve()
    json.dumps(dev)  # task inputs travel as JSON
    assert {t["hops"] for t in dev} >= {2, 3, 4}


def test_every_supporting_paragraph_is_in_the_shipped_corpus(real: Path) -> None:
    corpus = read_jsonl(real / "corpus.jsonl", "corpus")
    ids = {r["id"] for r in corpus}
    assert all(passage_id(r["title"], r["text"]) == r["id"] for r in corpus[:50])  # the same id scheme as ours
    for split in ("dev", "train"):
        for row in read_jsonl(real / f"{split}.jsonl", split):
            for p in row["paragraphs"]:
                if p["is_supporting"]:
                    assert passage_id(p["title"], p["paragraph_text"]) in ids


def test_hops_from_the_id_prefix() -> None:
    assert [hops_of(i) for i in ("2hop__1_2", "3hop1__1_2_3", "4hop3__9", "other")] == [2, 3, 4, None]


def test_the_task_definition() -> None:
    assert TASK.name == "musique" and TASK.metrics[0] == "f1"
    assert TASK.trainable_agents == ("researcher",) and TASK.eval_split in TASK.splits
    assert {r.name for r in TASK.air_rules()} >= {"air:empty_retrieval", "air:unparsable_answer"}


def test_without_a_corpus_file_the_rows_paragraphs_become_the_corpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGL_CACHE_DIR", str(tmp_path / "cache"))
    second = musique_row("3hop1__4_5_6", question="Where is the Seine?")
    second["paragraphs"].append({"idx": 2, "title": "Lyon", "paragraph_text": "Lyon is in France."})
    write_jsonl(tmp_path / "data" / "musique" / "dev.jsonl", [musique_row(), second])
    tasks = load(tmp_path / "data", "dev")
    corpus_path = Path(tasks[0]["corpus_path"])
    assert corpus_path.is_relative_to(tmp_path / "cache") and tasks[1]["corpus_path"] == str(corpus_path)
    corpus = read_jsonl(corpus_path, "corpus")
    assert [r["title"] for r in corpus] == ["Paris", "Seine", "Lyon"]  # the shared paragraphs once
    assert corpus == corpus_from_rows([musique_row(), second])
    assert tasks[1]["hops"] == 3 and tasks[0]["answers"] == ["Seine", "Seine River"]


def _data(tmp_path: Path, dev_text: str, corpus: str | None = '{"id": "p1", "title": "T", "text": "x"}\n') -> Path:
    folder = tmp_path / "musique"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "dev.jsonl").write_text(dev_text)
    if corpus is not None:
        (folder / "corpus.jsonl").write_text(corpus)
    return tmp_path


def test_missing_split_file(tmp_path: Path) -> None:
    (tmp_path / "musique").mkdir()
    with pytest.raises(DataError, match=r"train\.jsonl"):
        load(tmp_path, "train")
    with pytest.raises(DataError, match="no musique/ folder"):
        load(tmp_path / "musique", "dev")
    with pytest.raises(DataError, match="no split 'test'"):
        load(tmp_path, "test")


def test_bad_json_line_names_the_line(tmp_path: Path) -> None:
    root = _data(tmp_path, json.dumps(musique_row()) + "\n{not json\n")
    with pytest.raises(DataError, match=r"dev\.jsonl:2: not valid JSON"):
        load(root, "dev")


@pytest.mark.parametrize("field", ["answer", "question", "paragraphs", "answer_aliases", "id"])
def test_missing_field_names_the_field(tmp_path: Path, field: str) -> None:
    row = musique_row()
    del row[field]
    root = _data(tmp_path, json.dumps(musique_row()) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(DataError, match=rf"row 2: missing field\(s\) {field}"):
        load(root, "dev")


def test_malformed_fields(tmp_path: Path) -> None:
    root = _data(tmp_path, json.dumps(musique_row(answer_aliases="Seine River")) + "\n")
    with pytest.raises(DataError, match="answer_aliases must be a list"):
        load(root, "dev")
    bad_paragraph = musique_row(paragraphs=[{"idx": 0, "title": "Paris"}])
    root = _data(tmp_path, json.dumps(bad_paragraph) + "\n")
    with pytest.raises(DataError, match=r"paragraphs\[0\]: missing field\(s\) paragraph_text"):
        load(root, "dev")


def test_bad_corpus_file(tmp_path: Path) -> None:
    root = _data(tmp_path, json.dumps(musique_row()) + "\n", corpus='{"id": "p1", "title": "T"}\n')
    with pytest.raises(DataError, match=r"corpus\.jsonl: row 1: missing field\(s\) text"):
        load(root, "dev")
    root = _data(tmp_path, json.dumps(musique_row()) + "\n", corpus="\n")
    with pytest.raises(DataError, match="corpus is empty"):
        load(root, "dev")
