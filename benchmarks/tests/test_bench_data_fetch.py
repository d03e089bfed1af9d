"""`agl bench data fetch`: the official sources' own formats, downloaded, checked and swapped in whole.

The hub cannot be reached from here, so the tests stand up `fake_hub.FakeHub` (real HTTP) and point the real
`huggingface_hub` client at it with HF_ENDPOINT; the fixture files are made here in the sources' formats
(Calc-X parquet shards, MuSiQue's official JSON Lines, a `spider_data.zip` of SQLite databases).
"""

from __future__ import annotations

import io
import json
import os
import sqlite3
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fake_hub import FakeHub, Repo

from agl_bench import datasets
from agl_bench.calc_x.data import load as load_calc_x
from agl_bench.datasets import MANIFEST, DataError, datasets_root
from agl_bench.fetch import FetchError, fetch
from agl_bench.musique.data import load as load_musique
from agl_bench.sources import SOURCES
from agl_bench.spider.data import load as load_spider

AGL = [sys.executable, "-m", "agl.cli.main"]

# ------------------------------------------------------------------------------------------------ fixtures


def calc_x_rows(split: str, n: int) -> list[dict[str, str]]:
    return [
        {
            "id": f"gsm8k__{split}{i}",
            "question": f"What is {i} + 2?",
            "chain": f'<gadget id="calculator">{i} + 2</gadget><output>{i + 2}</output><result>{i + 2}</result>',
            "result": str(i + 2),
            "source_ds": "gsm8k",
        }
        for i in range(n)
    ]


def parquet_bytes(rows: list[dict[str, Any]]) -> bytes:
    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), out)
    return out.getvalue()


def calc_x_repo() -> Repo:
    return Repo(
        {
            "README.md": b"---\nlicense: mit\n---\n# Calc-X\n",
            "data/train-00000-of-00002-aaaa.parquet": parquet_bytes(calc_x_rows("a", 2)),
            "data/train-00001-of-00002-bbbb.parquet": parquet_bytes(calc_x_rows("b", 1)),
            "data/validation-00000-of-00001-cccc.parquet": parquet_bytes(calc_x_rows("v", 1)),
            "data/test-00000-of-00001-dddd.parquet": parquet_bytes(calc_x_rows("t", 2)),
        }
    )


def musique_row(qid: str, answer: str) -> dict[str, Any]:
    paragraphs = [
        {"idx": i, "title": f"Title {qid} {i}", "paragraph_text": f"Text {i} about {answer}.", "is_supporting": i == 0}
        for i in range(3)
    ]
    decomposition = [{"id": 1, "question": "q1", "answer": answer, "paragraph_support_idx": 0}]
    return {
        "id": qid,
        "paragraphs": paragraphs,
        "question": f"Who is {qid}?",
        "question_decomposition": decomposition,
        "answer": answer,
        "answer_aliases": [answer.upper()],
        "answerable": True,
    }


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def musique_repo() -> Repo:
    return Repo(
        {
            "musique_ans_v1.0_dev.jsonl": jsonl([musique_row("2hop__1_2", "Ada"), musique_row("3hop1__3_4_5", "Bo")]),
            "musique_ans_v1.0_train.jsonl": jsonl([musique_row("2hop__6_7", "Cy")]),
            ".gitattributes": b"*.jsonl filter=lfs\n",
        },
        commit="fedcba9876543210fedcba9876543210fedcba98",
    )


def spider_zip(
    tmp_path: Path,
    *,
    questions: list[dict[str, str]] | None = None,
    databases: tuple[str, ...] = ("shop",),
    extra: dict[str, bytes] | None = None,
) -> bytes:
    questions = questions or [
        {"db_id": "shop", "question": "How many items?", "query": "SELECT count(*) FROM item"},
        {"db_id": "shop", "question": "Names of items?", "query": "SELECT name FROM item ORDER BY name"},
    ]
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("spider_data/dev.json", json.dumps(questions))
        archive.writestr("spider_data/tables.json", "[]")
        archive.writestr("spider_data/train_spider.json", "[]")  # the training questions: not unpacked
        archive.writestr("__MACOSX/spider_data/._dev.json", b"\0")
        for db_id in databases:
            path = tmp_path / f"{db_id}.sqlite"
            path.unlink(missing_ok=True)
            conn = sqlite3.connect(path)
            conn.execute("CREATE TABLE item (id INTEGER PRIMARY KEY, name TEXT)")
            conn.executemany("INSERT INTO item (name) VALUES (?)", [("pen",), ("cup",)])
            conn.commit()
            conn.close()
            archive.write(path, f"spider_data/database/{db_id}/{db_id}.sqlite")
        for name, data in (extra or {}).items():
            archive.writestr(name, data)
    return out.getvalue()


def run_agl(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*AGL, *args], env={**os.environ, **env}, capture_output=True, text=True, timeout=180)


@pytest.fixture()
def hub_env(tmp_path: Path) -> dict[str, str]:
    return {
        "AGL_BENCH_DATA": str(tmp_path / "bench"),
        "AGL_CACHE_DIR": str(tmp_path / "agl-cache"),
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_ETAG_TIMEOUT": "30",
    }


# ----------------------------------------------------------------------------------- the hub, end to end


def test_calc_x_is_fetched_from_the_hub_checked_and_read_where_it_lies(tmp_path: Path, hub_env: dict[str, str]) -> None:
    with FakeHub() as hub:
        hub.repos[SOURCES["calc_x"].origin.repo_id] = repo = calc_x_repo()  # type: ignore[union-attr]
        done = run_agl(["bench", "data", "fetch", "calc_x"], {**hub_env, "HF_ENDPOINT": hub.url})
        assert done.returncode == 0, done.stderr
        assert any("/resolve/" in r and "test-00000" in r for r in hub.requests)
        shown = run_agl(["bench", "data", "show"], hub_env)
    folder = tmp_path / "bench" / "calc_x"
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["source"] == {
        "kind": "hub",
        "repo_id": "MU-NLPC/Calc-X",
        "revision": "main",
        "commit": repo.commit,
    }
    assert manifest["rows"] == {"train": 3, "validation": 1, "test": 2}
    assert set(manifest["files"]) == set(repo.files)  # the hub's files as they are, nothing converted
    assert not list((tmp_path / "bench").glob(".fetch-*")), "the staging folder is removed"
    assert f"{folder}\n" in shown.stdout and "MU-NLPC/Calc-X @ 0123456789ab" in shown.stdout
    # Read from there by `agl bench` (AGL_BENCH_DATA), the shards of a split in file-name order
    os.environ["AGL_BENCH_DATA"] = hub_env["AGL_BENCH_DATA"]
    try:
        root = datasets_root(None, "calc_x")
    finally:
        del os.environ["AGL_BENCH_DATA"]
    assert [t["id"] for t in load_calc_x(root, "train")] == ["gsm8k__a0", "gsm8k__a1", "gsm8k__b0"]
    assert load_calc_x(root, "test")[1] == {"id": "gsm8k__t1", "question": "What is 1 + 2?", "result": "3"}


def test_a_file_that_differs_from_the_hubs_checksum_fails_and_keeps_the_data_there(
    tmp_path: Path, hub_env: dict[str, str]
) -> None:
    with FakeHub() as hub:
        hub.repos["MU-NLPC/Calc-X"] = repo = calc_x_repo()
        env = {**hub_env, "HF_ENDPOINT": hub.url}
        assert run_agl(["bench", "data", "fetch", "calc_x"], env).returncode == 0
        folder = tmp_path / "bench" / "calc_x"
        before = (folder / MANIFEST).read_text()
        again = run_agl(["bench", "data", "fetch", "calc_x"], env)
        assert again.returncode == 0 and "already fetched" in again.stdout
        repo.tamper.add("data/test-00000-of-00001-dddd.parquet")
        repo.commit = "1111111111111111111111111111111111111111"
        failed = run_agl(["bench", "data", "fetch", "calc_x", "--force"], env)
    assert failed.returncode != 0
    assert "data/test-00000-of-00001-dddd.parquet: checksum" in failed.stderr, failed.stderr
    assert (folder / MANIFEST).read_text() == before, "the copy fetched before is untouched"
    assert len(load_calc_x(tmp_path / "bench", "test")) == 2
    assert not list((tmp_path / "bench").glob(".*")), "no staging or old copy is left behind"


def test_musique_official_files_are_fetched_and_loaded_with_a_corpus(tmp_path: Path, hub_env: dict[str, str]) -> None:
    with FakeHub() as hub:
        hub.repos["dgslibisey/MuSiQue"] = musique_repo()
        done = run_agl(["bench", "data", "fetch", "musique"], {**hub_env, "HF_ENDPOINT": hub.url})
        assert done.returncode == 0, done.stderr
    folder = tmp_path / "bench" / "musique"
    assert sorted(p.name for p in folder.iterdir()) == [
        MANIFEST,
        "musique_ans_v1.0_dev.jsonl",
        "musique_ans_v1.0_train.jsonl",
    ]
    assert json.loads((folder / MANIFEST).read_text())["rows"] == {"dev": 2, "train": 1}
    os.environ["AGL_CACHE_DIR"] = hub_env["AGL_CACHE_DIR"]
    try:
        dev = load_musique(tmp_path / "bench", "dev")
    finally:
        del os.environ["AGL_CACHE_DIR"]
    assert [(t["id"], t["answers"], t["hops"]) for t in dev] == [
        ("2hop__1_2", ["Ada", "ADA"], 2),
        ("3hop1__3_4_5", ["Bo", "BO"], 3),
    ]
    corpus = Path(dev[0]["corpus_path"]).read_text().splitlines()
    assert len(corpus) == 6 and Path(dev[0]["corpus_path"]).is_relative_to(tmp_path / "agl-cache")


def test_a_repository_the_hub_does_not_have_is_named_in_the_error(tmp_path: Path, hub_env: dict[str, str]) -> None:
    with FakeHub() as hub:
        failed = run_agl(["bench", "data", "fetch", "musique"], {**hub_env, "HF_ENDPOINT": hub.url})
    assert failed.returncode != 0
    assert "cannot download hf://datasets/dgslibisey/MuSiQue" in failed.stderr
    assert not (tmp_path / "bench" / "musique").exists()


# ------------------------------------------------------------------------------------ the Spider archive


def test_spider_archive_from_a_url_unpacks_only_the_data_and_checks_every_gold_query(tmp_path: Path) -> None:
    with FakeHub() as hub:
        hub.files["/spider_data.zip"] = (spider_zip(tmp_path), "application/zip")
        messages: list[str] = []
        folder = fetch(
            "spider", into=tmp_path / "bench", archive=f"{hub.url}/spider_data.zip", progress=messages.append
        )
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == [
        MANIFEST,
        "database/shop/shop.sqlite",
        "dev.json",
        "tables.json",
    ]
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["source"]["kind"] == "archive" and manifest["source"]["url"].endswith("/spider_data.zip")
    assert manifest["rows"] == {"dev": 2, "train": 2, "test": 0}
    tasks = load_spider(tmp_path / "bench", "dev")
    assert [t["id"] for t in tasks] == ["spider_dev_0000", "spider_dev_0001"]
    assert tasks[0]["db_path"] == str((folder / "database" / "shop" / "shop.sqlite").resolve())
    assert "CREATE TABLE item" in tasks[0]["schema"]


def test_spider_archive_from_a_local_file(tmp_path: Path) -> None:
    archive = tmp_path / "spider_data.zip"
    archive.write_bytes(spider_zip(tmp_path))
    folder = fetch("spider", into=tmp_path / "bench", archive=str(archive), progress=lambda _: None)
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["source"]["path"] == str(archive.resolve()) and manifest["source"]["size"] == archive.stat().st_size


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: spider_zip(p, extra={"spider_data/../../evil.txt": b"x"}), "unsafe path"),
        (lambda p: spider_zip(p, databases=()), "database of shop not found"),
        (
            lambda p: spider_zip(p, questions=[{"db_id": "shop", "question": "?", "query": "SELECT nope FROM item"}]),
            "1 of 1 gold queries fail on their database (spider_dev_0000: OperationalError",
        ),
        (lambda p: b"<html>Google Drive - quota exceeded</html>", "not a zip archive"),
    ],
)
def test_a_bad_spider_archive_is_refused_and_nothing_is_left(tmp_path: Path, make: Any, message: str) -> None:
    archive = tmp_path / "spider_data.zip"
    archive.write_bytes(make(tmp_path))
    with pytest.raises(FetchError, match=message.replace("(", r"\(").replace("?", r"\?")):
        fetch("spider", into=tmp_path / "bench", archive=str(archive), progress=lambda _: None)
    assert list((tmp_path / "bench").iterdir()) == []
    assert not (tmp_path / "evil.txt").exists()


def test_a_web_page_in_place_of_the_archive_says_how_to_download_it_by_hand(tmp_path: Path) -> None:
    with FakeHub() as hub:
        hub.files["/download"] = (b"<html>sign in</html>", "text/html; charset=utf-8")
        with pytest.raises(
            FetchError, match=r"answered a web page, not the archive; download spider_data\.zip by hand"
        ):
            fetch("spider", into=tmp_path / "bench", archive=f"{hub.url}/download", progress=lambda _: None)


def test_a_folder_agl_did_not_fetch_is_never_replaced_without_force(tmp_path: Path) -> None:
    mine = tmp_path / "bench" / "spider"
    mine.mkdir(parents=True)
    (mine / "dev.json").write_text("[]")
    archive = tmp_path / "spider_data.zip"
    archive.write_bytes(spider_zip(tmp_path))
    with pytest.raises(FetchError, match="holds data agl did not fetch"):
        fetch("spider", into=tmp_path / "bench", archive=str(archive), progress=lambda _: None)
    assert (mine / "dev.json").read_text() == "[]"
    fetch("spider", into=tmp_path / "bench", archive=str(archive), force=True, progress=lambda _: None)
    assert (mine / MANIFEST).is_file()


def test_options_for_the_other_kind_of_source_are_refused(tmp_path: Path) -> None:
    with pytest.raises(FetchError, match="--archive is for spider"):
        fetch("calc_x", into=tmp_path, archive="x.zip", progress=lambda _: None)
    with pytest.raises(FetchError, match="--revision is for the hub"):
        fetch("spider", into=tmp_path, revision="v1", progress=lambda _: None)


# ------------------------------------------------------------------------------ where the data is read from


def test_fetched_data_is_preferred_to_the_shared_folder_and_a_missing_task_says_how_to_fetch_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGL_BENCH_DATA", raising=False)
    monkeypatch.delenv("AGL_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    shared = tmp_path / "shared" / "datasets"
    (shared / "spider").mkdir(parents=True)
    monkeypatch.setattr(datasets, "shared_root", lambda: shared)
    assert datasets_root(None, "spider") == shared
    cache = tmp_path / ".cache" / "agl" / "bench"
    (cache / "spider").mkdir(parents=True)
    assert datasets_root(None, "spider") == shared, "a folder without a finished fetch's manifest is not used"
    (cache / "spider" / MANIFEST).write_text("{}")
    assert datasets_root(None, "spider") == cache
    with pytest.raises(
        DataError,
        match=r"no musique data found: looked in .*musique and ../shared/datasets; run "
        r"`agl bench data fetch musique`",
    ):
        datasets_root(None, "musique")
    assert datasets_root(str(shared), "musique") == shared, "--data is taken as given"
