"""MuSiQue retrieval: BM25 finds supporting paragraphs of real questions, empty searches have no hits, indexes
are cached per corpus file, and the dense path works against a real (fake) embeddings endpoint."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from musique_support import SMALL_CORPUS, embedding_server, write_jsonl

from agl_bench.datasets import datasets_root, read_jsonl
from agl_bench.musique.retrieval import (
    Hit,
    Passage,
    clear_cache,
    embeddings_path,
    format_passages,
    get_retriever,
)


@pytest.fixture(autouse=True)
def _fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("AGL_CACHE_DIR", str(tmp_path / "cache"))
    clear_cache()
    yield
    clear_cache()


@pytest.fixture(scope="module")
def real() -> Path:
    return datasets_root() / "musique"


def _sub_question(decomposition: list[dict[str, Any]], step: int) -> str:
    """A decomposition step as a search query: `#n` replaced by step n's answer, `>>` by a space."""
    question = re.sub(
        r"#(\d+)", lambda m: str(decomposition[int(m.group(1)) - 1]["answer"]), decomposition[step]["question"]
    )
    return question.replace(">>", " ")


def test_bm25_ranks_supporting_paragraphs_of_real_questions(real: Path) -> None:
    started = time.perf_counter()
    retriever = get_retriever(real / "corpus.jsonl")
    assert time.perf_counter() - started < 5.0  # measured ~0.4 s for the 5,021 paragraphs
    rows = read_jsonl(real / "dev.jsonl", "dev")[:20]
    first_found = all_found = steps = 0
    for row in rows:
        decomposition = row["question_decomposition"]
        for step, part in enumerate(decomposition):
            gold = row["paragraphs"][part["paragraph_support_idx"]]
            hits = retriever.search(_sub_question(decomposition, step), 3)
            assert len(hits) == 3 and hits[0].score >= hits[1].score >= hits[2].score > 0
            found = any(h.passage.title == gold["title"] and h.passage.text == gold["paragraph_text"] for h in hits)
            first_found += found and step == 0
            all_found += found
            steps += 1
    assert first_found / len(rows) >= 0.75  # measured 18/20
    assert all_found / steps >= 0.65  # measured 0.78


def test_queries_without_matching_words_have_no_hits(real: Path) -> None:
    retriever = get_retriever(real / "corpus.jsonl")
    for query in ("", "   ", "?!", "the of and it", "zzqxv"):
        assert retriever.search(query, 3) == [], query
    assert retriever.search("Van Hook Township", 0) == []


def test_index_is_cached_per_corpus_file_and_rebuilt_when_it_changes(tmp_path: Path) -> None:
    corpus = write_jsonl(tmp_path / "corpus.jsonl", SMALL_CORPUS)
    first = get_retriever(corpus)
    assert get_retriever(str(corpus)) is first
    assert [h.passage.id for h in first.search("Spree river", 2)] == ["p2", "p3"]  # "river" is also in p3
    assert len(first.search("river", 10)) == 2  # k beyond the corpus: only the positive scores
    write_jsonl(corpus, [*SMALL_CORPUS, {"id": "p5", "title": "Spree", "text": "The Spree is a river."}])
    second = get_retriever(corpus)
    assert second is not first and second.search("Spree", 1)[0].passage.id == "p5"


def test_bad_retriever_options(tmp_path: Path) -> None:
    corpus = write_jsonl(tmp_path / "corpus.jsonl", SMALL_CORPUS)
    with pytest.raises(ValueError, match="unknown retriever 'tfidf'"):
        get_retriever(corpus, "tfidf")
    with pytest.raises(ValueError, match="needs embedding_url and embedding_model"):
        get_retriever(corpus, "dense", embedding_model="m")


def test_format_passages_numbers_titles_and_truncates() -> None:
    long = Passage("p1", "Long", "word " * 200)
    short = Passage("p2", "Short", "Two\n words.")
    text = format_passages([Hit(long, 2.0), Hit(short, 1.0)], max_chars=50)
    first, second = text.split("\n")
    assert first.startswith("[1] Long: word word") and first.endswith(" …")
    assert len(first) <= len("[1] Long: ") + 50 + 2
    assert second == "[2] Short: Two words."
    assert format_passages([]) == ""


def test_dense_retrieval_through_an_embeddings_endpoint(tmp_path: Path) -> None:
    corpus = write_jsonl(tmp_path / "corpus.jsonl", SMALL_CORPUS)
    with embedding_server() as server:
        retriever = get_retriever(corpus, "dense", embedding_url=server.url, embedding_model="hash/bow-256")
        assert retriever.kind == "dense"
        assert sum(len(r) for r in server.requests) == len(SMALL_CORPUS)  # the corpus, embedded once
        assert [h.passage.id for h in retriever.search("capital of France", 1)] == ["p1"]
        hits = retriever.search("Which capital is on the Spree river?", 3)
        assert hits[0].passage.id == "p2" and {h.passage.id for h in hits} == {"p1", "p2", "p3"}
        assert all(0.0 < h.score <= 1.0 + 1e-6 for h in hits)  # cosine similarities
        assert retriever.search("zebra", 3) == [] and retriever.search("  ", 3) == []

        cached = embeddings_path(corpus, "hash/bow-256")
        assert cached.is_file() and cached.is_relative_to(tmp_path / "cache" / "derived" / "musique")
        # a new process (emulated: the in-memory cache cleared) reads the corpus embeddings from disk
        clear_cache()
        before = len(server.requests)
        again = get_retriever(corpus, "dense", embedding_url=server.url, embedding_model="hash/bow-256")
        assert again is not retriever and len(server.requests) == before
        assert [h.passage.id for h in again.search("highest mountain", 1)] == ["p4"]
        assert server.requests[-1] == ["highest mountain"]  # only the query was embedded
        # another model is another cache entry
        get_retriever(corpus, "dense", embedding_url=server.url, embedding_model="other")
        assert sum(len(r) for r in server.requests[before + 1 :]) == len(SMALL_CORPUS)
