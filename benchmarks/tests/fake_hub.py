"""A stand-in for the Hugging Face hub (which this machine cannot reach), spoken to over real HTTP.

It answers the three calls the hub client makes to download a dataset repository — the revision's commit
(`/api/datasets/<repo>/revision/<rev>`), the file tree with checksums (`/api/datasets/<repo>/tree/<rev>`), and
the files themselves (`/datasets/<repo>/resolve/<rev>/<path>`, HEAD and GET) — so `agl bench data fetch` runs
the real `huggingface_hub` against it (HF_ENDPOINT). Any other path is served from `files` as a plain web
server (the Spider archive). `tamper` serves a file's bytes changed after its checksum was published.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_API = re.compile(r"^/api/datasets/(?P<repo>[^/]+/[^/]+)/(?P<kind>revision|tree)/(?P<rev>[^/?]+)")
_RESOLVE = re.compile(r"^/datasets/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
LFS_MIN_BYTES = 1024  # the hub keeps binary and large files in LFS (sha256), small text in git (blob sha1)


@dataclass
class Repo:
    files: dict[str, bytes]
    commit: str = "0123456789abcdef0123456789abcdef01234567"
    tamper: set[str] = field(default_factory=set)

    def entry(self, path: str) -> dict[str, Any]:
        data = self.files[path]
        entry: dict[str, Any] = {"type": "file", "path": path, "size": len(data)}
        entry["oid"] = hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()
        if self.in_lfs(path):
            entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return entry

    def in_lfs(self, path: str) -> bool:
        return path.endswith(".parquet") or len(self.files[path]) >= LFS_MIN_BYTES

    def served(self, path: str) -> bytes:
        data = self.files[path]
        if path in self.tamper:  # same size, so only a checksum can tell
            return bytes([data[0] ^ 1]) + data[1:]
        return data


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.files: dict[str, tuple[bytes, str]] = {}  # plain web files: path → (bytes, content type)
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet test output
                pass

            def do_HEAD(self) -> None:
                hub.handle(self, body=False)

            def do_GET(self) -> None:
                hub.handle(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def handle(self, request: BaseHTTPRequestHandler, *, body: bool) -> None:
        path = request.path
        self.requests.append(f"{request.command} {path}")
        if match := _API.match(path):
            repo = self.repos.get(match["repo"])
            if repo is None:
                return self.reply(
                    request,
                    404,
                    b'{"error":"Repository not found"}',
                    "application/json",
                    body,
                    {"X-Error-Code": "RepoNotFound"},
                )
            if match["kind"] == "revision":
                info = {"id": match["repo"], "sha": repo.commit, "siblings": [{"rfilename": p} for p in repo.files]}
                return self.reply(request, 200, json.dumps(info).encode(), "application/json", body)
            tree = [repo.entry(p) for p in sorted(repo.files)]
            return self.reply(request, 200, json.dumps(tree).encode(), "application/json", body)
        if match := _RESOLVE.match(path):
            repo = self.repos.get(match["repo"])
            if repo is None or match["path"] not in repo.files:
                return self.reply(request, 404, b"not found", "text/plain", body, {"X-Error-Code": "EntryNotFound"})
            entry = repo.entry(match["path"])
            etag = entry["lfs"]["oid"] if "lfs" in entry else entry["oid"]
            headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{etag}"'}
            return self.reply(request, 200, repo.served(match["path"]), "application/octet-stream", body, headers)
        if path in self.files:
            data, content_type = self.files[path]
            return self.reply(request, 200, data, content_type, body)
        return self.reply(request, 404, b"not found", "text/plain", body)

    @staticmethod
    def reply(
        request: BaseHTTPRequestHandler,
        status: int,
        data: bytes,
        content_type: str,
        body: bool,
        headers: dict[str, str] | None = None,
    ) -> None:
        request.send_response(status)
        request.send_header("Content-Type", content_type)
        request.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            request.send_header(key, value)
        request.end_headers()
        if body:
            request.wfile.write(data)
