"""Helpers for the MuSiQue tests: a fake OpenAI-compatible embeddings server and hand-made data files."""

from __future__ import annotations

import json
import re
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

DIMENSIONS = 256
_STOPWORDS = {"the", "a", "an", "of", "in", "is", "was", "what", "which", "who", "and", "to"}


def hashed_embedding(text: str) -> list[float]:
    """Bag of words hashed into a fixed vector: texts that share (non-stop)words point the same way."""
    vector = np.zeros(DIMENSIONS)
    for word in re.findall(r"\w+", text.lower()):
        if word not in _STOPWORDS:
            vector[zlib.crc32(word.encode()) % DIMENSIONS] += 1.0
    return [float(x) for x in vector]


class EmbeddingServer:
    """`/v1/embeddings` on a real loopback port, standing in for a remote embedding API; keeps each request's
    inputs so tests can see what was (not) asked."""

    def __init__(self) -> None:
        self.requests: list[list[str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
                if self.path.rstrip("/") != "/v1/embeddings" or not all(isinstance(t, str) for t in inputs):
                    self.send_error(400)
                    return
                server.requests.append(list(inputs))
                payload: dict[str, Any] = {
                    "object": "list",
                    "model": body["model"],
                    "data": [
                        {"object": "embedding", "index": i, "embedding": hashed_embedding(t)}
                        for i, t in enumerate(inputs)
                    ],
                    "usage": {"prompt_tokens": 0, "total_tokens": 0},
                }
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self) -> EmbeddingServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


@contextmanager
def embedding_server() -> Iterator[EmbeddingServer]:
    with EmbeddingServer() as server:
        yield server


SMALL_CORPUS = [
    {"id": "p1", "title": "Paris", "text": "Paris is the capital and largest city of France."},
    {"id": "p2", "title": "Berlin", "text": "Berlin is the capital of Germany, on the river Spree."},
    {"id": "p3", "title": "Danube", "text": "The Danube river flows through Vienna and Budapest."},
    {"id": "p4", "title": "Mount Everest", "text": "Everest is the highest mountain above sea level."},
]


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def musique_row(qid: str = "2hop__1_2", **overrides: Any) -> dict[str, Any]:
    """A small row in the official schema."""
    row: dict[str, Any] = {
        "id": qid,
        "paragraphs": [
            {"idx": 0, "title": "Paris", "paragraph_text": "Paris is the capital of France.", "is_supporting": True},
            {"idx": 1, "title": "Seine", "paragraph_text": "The Seine flows through Paris.", "is_supporting": False},
        ],
        "question": "What river flows through the capital of France?",
        "question_decomposition": [],
        "answer": "Seine",
        "answer_aliases": ["Seine River"],
        "answerable": True,
    }
    row.update(overrides)
    return row
