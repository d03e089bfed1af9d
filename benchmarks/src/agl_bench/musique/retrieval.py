"""Searching the MuSiQue corpus: BM25 (default) or dense embeddings, and formatting hits for the prompt.

- **BM25** (`bm25s`, numpy backend): title + text, lower-cased, English stopwords removed, no stemming (bm25s
  stems only through the optional PyStemmer package, which the benchmark does not require). Building the index
  of the 5,021-paragraph corpus takes about 0.4 s on one CPU core.
- **Dense**: embeddings from any OpenAI-compatible `/v1/embeddings` endpoint (`embedding_url`,
  `embedding_model`; the key from `$AGL_EMBEDDING_API_KEY`, else `$OPENAI_API_KEY`, else a placeholder that
  local servers ignore), cosine similarity in numpy. The corpus embeddings are computed once and kept on disk at
  `$AGL_CACHE_DIR/derived/musique/embeddings/<corpus sha256>-<model>.npy` (default `~/.cache/agl`).

Either index is built once per corpus file per process and kept in a module-level cache keyed by the file's
path, modification time and size (and, for dense, endpoint and model), so a worker running many rollouts pays
for it once. A hit is a passage with a positive score: a query whose words are all stopwords, punctuation or
absent from the corpus has no hits, which the agent reports (see `agent.py`).
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import bm25s
import numpy as np
import numpy.typing as npt

from agl_bench.musique.data import cache_dir, read_corpus_rows

RetrieverKind = Literal["bm25", "dense"]
RETRIEVERS: tuple[RetrieverKind, ...] = ("bm25", "dense")
PASSAGE_CHARS = 400  # per passage in the prompt: three of them stay well inside a small model's context
EMBEDDING_BATCH = 64
Matrix = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str


@dataclass(frozen=True)
class Hit:
    passage: Passage
    score: float


class Retriever(Protocol):
    @property
    def kind(self) -> str: ...

    def search(self, query: str, k: int) -> list[Hit]: ...


def read_passages(path: Path) -> list[Passage]:
    return [Passage(r["id"], r["title"], r["text"]) for r in read_corpus_rows(path)]


def _tokenize(texts: list[str], *, return_ids: bool) -> bm25s.tokenization.Tokenized | list[list[str]]:
    return bm25s.tokenize(texts, stopwords="en", return_ids=return_ids, show_progress=False)


class BM25Retriever:
    kind = "bm25"

    def __init__(self, passages: Sequence[Passage]) -> None:
        if not passages:
            raise ValueError("cannot index an empty corpus")
        self.passages = list(passages)
        self._model = bm25s.BM25(backend="numpy")
        self._model.index(
            _tokenize([f"{p.title}\n{p.text}" for p in self.passages], return_ids=True), show_progress=False
        )

    def search(self, query: str, k: int) -> list[Hit]:
        tokens = _tokenize([query], return_ids=False)
        assert isinstance(tokens, list)
        if not tokens[0] or k < 1:
            return []
        docs, scores = self._model.retrieve(tokens, k=min(k, len(self.passages)), show_progress=False, n_threads=1)
        return [Hit(self.passages[int(d)], float(s)) for d, s in zip(docs[0], scores[0], strict=True) if float(s) > 0.0]


class DenseRetriever:
    kind = "dense"

    def __init__(self, passages: Sequence[Passage], embeddings: Matrix, embed: Callable[[list[str]], Matrix]) -> None:
        if len(passages) != len(embeddings):
            raise ValueError(f"{len(passages)} passages but {len(embeddings)} embeddings")
        self.passages = list(passages)
        self._embeddings = embeddings
        self._embed = embed

    def search(self, query: str, k: int) -> list[Hit]:
        if not query.strip() or k < 1:
            return []
        similarity = self._embeddings @ self._embed([query])[0]
        top = np.argsort(-similarity, kind="stable")[:k]
        return [Hit(self.passages[int(i)], float(similarity[i])) for i in top if similarity[i] > 0.0]


def _unit_rows(matrix: Matrix) -> Matrix:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return (matrix / np.where(norms == 0.0, 1.0, norms)).astype(np.float32)


def embedder(url: str, model: str, api_key: str | None = None) -> Callable[[list[str]], Matrix]:
    """`texts → unit-length embeddings` through an OpenAI-compatible endpoint."""
    from openai import OpenAI  # imported here: the BM25 path does not need the SDK

    key = api_key or os.environ.get("AGL_EMBEDDING_API_KEY") or os.environ.get("OPENAI_API_KEY") or "EMPTY"
    client = OpenAI(base_url=url, api_key=key)

    def embed(texts: list[str]) -> Matrix:
        rows: list[list[float]] = []
        for start in range(0, len(texts), EMBEDDING_BATCH):
            batch = texts[start : start + EMBEDDING_BATCH]
            # "float": servers that do not speak the SDK's default base64 encoding still work
            response = client.embeddings.create(model=model, input=batch, encoding_format="float")
            data = sorted(response.data, key=lambda d: d.index)
            if len(data) != len(batch):
                raise RuntimeError(f"embedding endpoint {url} returned {len(data)} embeddings for {len(batch)} texts")
            rows += [list(d.embedding) for d in data]
        return _unit_rows(np.asarray(rows, dtype=np.float32))

    return embed


def embeddings_path(corpus_path: Path, model: str) -> Path:
    digest = hashlib.sha256(corpus_path.read_bytes()).hexdigest()[:16]
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", model).strip("_") or "model"
    return cache_dir() / "embeddings" / f"{digest}-{slug}.npy"


def corpus_embeddings(
    corpus_path: Path, passages: Sequence[Passage], model: str, embed: Callable[[list[str]], Matrix]
) -> Matrix:
    """The passages' embeddings, from the disk cache when this corpus was embedded with this model before."""
    path = embeddings_path(corpus_path, model)
    if path.is_file():
        cached = np.load(path)
        if cached.shape[0] == len(passages):
            return np.asarray(cached, dtype=np.float32)
    matrix = embed([f"{p.title}: {p.text}" for p in passages])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npy")  # whole file, then rename: readers never see half
    np.save(tmp, matrix)
    tmp.replace(path)
    return matrix


_CACHE: dict[tuple[str, ...], Retriever] = {}
_LOCK = threading.Lock()


def get_retriever(
    corpus_path: str | Path,
    kind: str = "bm25",
    *,
    embedding_url: str | None = None,
    embedding_model: str | None = None,
) -> Retriever:
    """The index of a corpus file, built on first use in this process and reused while the file is unchanged."""
    if kind not in RETRIEVERS:
        raise ValueError(f"unknown retriever {kind!r}; choose one of {', '.join(RETRIEVERS)}")
    if kind == "dense" and not (embedding_url and embedding_model):
        raise ValueError("the dense retriever needs embedding_url and embedding_model")
    path = Path(corpus_path).resolve()
    stat = path.stat()
    key = (kind, str(path), str(stat.st_mtime_ns), str(stat.st_size), embedding_url or "", embedding_model or "")
    with _LOCK:  # one build per key even when concurrent rollouts ask at once
        retriever = _CACHE.get(key)
        if retriever is None:
            passages = read_passages(path)
            if kind == "bm25":
                retriever = BM25Retriever(passages)
            else:
                assert embedding_url and embedding_model
                embed = embedder(embedding_url, embedding_model)
                retriever = DenseRetriever(passages, corpus_embeddings(path, passages, embedding_model, embed), embed)
            _CACHE[key] = retriever
        return retriever


def clear_cache() -> None:
    with _LOCK:
        _CACHE.clear()


def format_passages(hits: Sequence[Hit], max_chars: int = PASSAGE_CHARS) -> str:
    """Numbered passages with titles, each cut to `max_chars` characters: `[1] Title: text…`."""
    lines = []
    for n, hit in enumerate(hits, 1):
        text = " ".join(hit.passage.text.split())
        if len(text) > max_chars:
            text = text[:max_chars].rsplit(" ", 1)[0] + " …"
        lines.append(f"[{n}] {hit.passage.title}: {text}")
    return "\n".join(lines)
