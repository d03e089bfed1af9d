"""`agl bench data fetch TASK`: download a task's data from its official source into the cache, verify it, and
put it where the loaders look (`$AGL_BENCH_DATA/<task>/`, default `~/.cache/agl/bench/<task>/`).

The files are kept as the source publishes them (parquet shards, JSON Lines, the archive's own folder); the
loaders read those formats, so nothing is converted. A fetch is all-or-nothing: it downloads into a staging
folder beside the target, checks every file (the hub's own checksums; the archive's paths and sizes), loads
every split with the task's own checks, writes `SOURCE.json` (where from, which commit, each file's sha256,
rows per split), and only then swaps the folder in. A failed or interrupted fetch leaves the data already
there untouched.
"""

from __future__ import annotations

import datetime as _dt
import fnmatch
import hashlib
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from agl_bench.datasets import MANIFEST, DataError, fetch_root
from agl_bench.sources import ArchiveSource, HubSource, Source, get_source

Progress = Callable[[str], None]

MAX_UNPACKED_BYTES = 8 * 1024**3  # spider_data.zip unpacks to ~1 GB; more than this is not that archive
_CHUNK = 1024 * 1024


class FetchError(RuntimeError):
    """A download or check that failed; the message says what, where, and what to do instead."""


def fetch(
    task: str,
    *,
    into: Path | None = None,
    revision: str | None = None,
    archive: str | None = None,
    force: bool = False,
    progress: Progress = print,
) -> Path:
    """Fetch TASK's data into `into/<task>` (default: the cache); return that folder."""
    source = get_source(task)
    root = (into or fetch_root()).expanduser()
    target = root / source.task
    if (target / MANIFEST).is_file() and not force:
        progress(f"{source.task}: already fetched in {target} (--force fetches it again)")
        return target
    if target.exists() and not force:
        raise FetchError(f"{target} holds data agl did not fetch (no {MANIFEST}); move it away, or --force replaces it")
    if archive is not None and not isinstance(source.origin, ArchiveSource):
        raise FetchError(f"--archive is for spider and quixbugs; {source.task} comes from {source.origin.describe()}")
    if revision is not None and not isinstance(source.origin, HubSource):
        raise FetchError(f"--revision is for the hub's datasets; {source.task} comes from an archive")
    root.mkdir(parents=True, exist_ok=True)
    staging_root = Path(tempfile.mkdtemp(prefix=f".fetch-{source.task}-", dir=root))
    try:
        staging = staging_root / source.task
        staging.mkdir()
        if isinstance(source.origin, HubSource):
            origin = _fetch_hub(source.origin, staging, revision, progress)
        else:
            origin = _fetch_archive(source.origin, staging, archive, progress)
        progress(f"{source.task}: checking every split")
        rows = _check(source.task, staging)
        manifest = _manifest(source, origin, staging, rows)
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        _swap_in(staging, target)
    finally:
        shutil.rmtree(staging_root, ignore_errors=True)
    progress(f"{source.task}: {', '.join(f'{s} {n:,} rows' for s, n in rows.items())} in {target}")
    return target


# ------------------------------------------------------------------------------------------------ the hub


def _fetch_hub(origin: HubSource, staging: Path, revision: str | None, progress: Progress) -> dict[str, Any]:
    # Imported here: only a fetch needs the hub client (it honours HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE).
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.hf_api import RepoFile

    api = HfApi()
    where = f"hf://datasets/{origin.repo_id}"
    try:
        commit = api.dataset_info(origin.repo_id, revision=revision or origin.revision).sha
        entries = [
            f
            for f in api.list_repo_tree(origin.repo_id, recursive=True, revision=commit, repo_type="dataset")
            if isinstance(f, RepoFile) and any(fnmatch.fnmatch(f.path, p) for p in origin.patterns)
        ]
        if not entries:
            raise FetchError(f"{where} at {commit} has no file matching {', '.join(origin.patterns)}")
        progress(f"{where} @ {commit}: {len(entries)} files, {sum(e.size for e in entries) / 1e6:,.1f} MB")
        snapshot_download(
            origin.repo_id,
            repo_type="dataset",
            revision=commit,
            allow_patterns=[e.path for e in entries],
            local_dir=staging,
        )
    except FetchError:
        raise
    except Exception as exc:  # the hub client raises httpx and its own errors (not found, gated, offline)
        raise FetchError(
            f"cannot download {where} ({type(exc).__name__}: {exc}); check the network (HF_ENDPOINT, HF_TOKEN), "
            "or read a local copy with --data DIR"
        ) from exc
    shutil.rmtree(staging / ".cache", ignore_errors=True)  # the hub client's bookkeeping, not data
    for entry in entries:
        expected = entry.lfs.sha256 if entry.lfs is not None else entry.blob_id
        actual = _sha256(staging / entry.path) if entry.lfs is not None else _git_blob_sha1(staging / entry.path)
        if actual != expected:
            raise FetchError(f"{where}/{entry.path}: checksum {actual} differs from the hub's {expected}")
    return {"kind": "hub", "repo_id": origin.repo_id, "revision": revision or origin.revision, "commit": commit}


def _git_blob_sha1(path: Path) -> str:
    """The id git (and so the hub) gives a file not stored in LFS."""
    return _digest(path, hashlib.sha1(f"blob {path.stat().st_size}\0".encode()))


def _sha256(path: Path) -> str:
    return _digest(path, hashlib.sha256())


def _digest(path: Path, digest: Any) -> str:
    """`digest` (a hashlib object, perhaps already fed a header) of the file's bytes, read in chunks."""
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return str(digest.hexdigest())


# -------------------------------------------------------------------------------------------- the archive


def _fetch_archive(origin: ArchiveSource, staging: Path, archive: str | None, progress: Progress) -> dict[str, Any]:
    given = archive or origin.url
    if given.startswith(("http://", "https://")):
        zip_path = staging.parent / "download.zip"
        _download(given, zip_path, origin, progress)
        described: dict[str, Any] = {"kind": "archive", "url": given}
    else:
        zip_path = Path(given).expanduser()
        if not zip_path.is_file():
            raise FetchError(f"--archive {zip_path}: no such file")
        described = {"kind": "archive", "path": str(zip_path.resolve())}
    if not zipfile.is_zipfile(zip_path):
        raise FetchError(f"{given}: not a zip archive (download {origin.top}.zip from {origin.page})")
    described.update(sha256=_sha256(zip_path), size=zip_path.stat().st_size)
    progress(f"unpacking {origin.top}/ ({described['size'] / 1e6:,.1f} MB archive)")
    _unpack(zip_path, origin, staging)
    return described


def _download(url: str, path: Path, origin: ArchiveSource, progress: Progress) -> None:
    import httpx

    by_hand = f"download {origin.top}.zip by hand from {origin.page} and run again with --archive PATH"
    try:
        with httpx.stream("GET", url, follow_redirects=True, timeout=60.0) as response:
            if response.status_code != 200:
                raise FetchError(f"{url} answered HTTP {response.status_code}; {by_hand}")
            if "text/html" in response.headers.get("content-type", ""):
                # Google Drive answers a web page (quota exceeded, sign-in) with 200 instead of the file
                raise FetchError(f"{url} answered a web page, not the archive; {by_hand}")
            total = int(response.headers.get("content-length") or 0)
            done, shown = 0, 0
            with path.open("wb") as f:
                for chunk in response.iter_bytes(_CHUNK):
                    f.write(chunk)
                    done += len(chunk)
                    if done - shown >= 16 * _CHUNK:
                        shown = done
                        of = f" of {total / 1e6:,.0f}" if total else ""
                        progress(f"downloaded {done / 1e6:,.0f}{of} MB")
    except httpx.HTTPError as exc:
        raise FetchError(f"cannot download {url} ({type(exc).__name__}: {exc}); {by_hand}") from exc


def _unpack(zip_path: Path, origin: ArchiveSource, staging: Path) -> None:
    """The archive's `top/` folder into `staging`, only the paths `keep` names; refuses unsafe archives."""
    unpacked = 0
    found = False
    with zipfile.ZipFile(zip_path) as archive:
        for member in archive.infolist():
            parts = PurePosixPath(member.filename).parts
            if member.filename.startswith("/") or ".." in parts or "\\" in member.filename:
                raise FetchError(f"{zip_path}: unsafe path {member.filename!r} in the archive; nothing unpacked")
            if not parts or parts[0] != origin.top or member.is_dir() or len(parts) < 2:
                continue  # other top-level entries (e.g. __MACOSX/) are not the data
            found = True
            relative = "/".join(parts[1:])
            if not any(fnmatch.fnmatch(relative, p) for p in origin.keep):
                continue
            unpacked += member.file_size
            if unpacked > MAX_UNPACKED_BYTES:
                raise FetchError(
                    f"{zip_path}: unpacks to more than {MAX_UNPACKED_BYTES / 1e9:.0f} GB; not {origin.top}"
                )
            destination = staging.joinpath(*parts[1:])
            destination.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(member) as src, destination.open("wb") as dst:
                shutil.copyfileobj(src, dst, _CHUNK)
    if not found:
        raise FetchError(f"{zip_path}: no {origin.top}/ folder in the archive (is it {origin.top}.zip?)")


# ------------------------------------------------------------------------------------ checks and install


def _check(task: str, folder: Path) -> dict[str, int]:
    """Rows per split, read with the task's own checks; a DataError names the file and row at fault."""
    from agl_bench.calc_x.data import check as check_calc_x
    from agl_bench.musique.data import check as check_musique
    from agl_bench.quixbugs.data import check as check_quixbugs
    from agl_bench.spider.data import check as check_spider
    from agl_bench.swebench.data import check as check_swebench
    from agl_bench.swebench.data import check_verified as check_swebench_verified

    checks = {"calc_x": check_calc_x, "musique": check_musique, "spider": check_spider, "quixbugs": check_quixbugs}
    checks.update(swebench=check_swebench, swebench_verified=check_swebench_verified)
    try:
        rows = checks[task](folder)
    except DataError as exc:
        raise FetchError(f"the fetched {task} data failed its checks: {exc}") from exc
    if not rows:
        raise FetchError(f"the fetched {task} data holds no split the benchmark reads")
    return rows


def _manifest(source: Source, origin: dict[str, Any], folder: Path, rows: dict[str, int]) -> dict[str, Any]:
    files = {
        path.relative_to(folder).as_posix(): {"size": path.stat().st_size, "sha256": _sha256(path)}
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }
    return {
        "task": source.task,
        "source": origin,
        "license": source.license,
        "cite": source.cite,
        "fetched_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "rows": rows,
        "files": files,
    }


def _swap_in(staging: Path, target: Path) -> None:
    """Replace `target` by `staging` so that at every moment one whole copy exists on disk."""
    old = target.with_name(f".old-{target.name}-{os.getpid()}")
    if target.exists():
        target.rename(old)
    try:
        staging.rename(target)
    except OSError:
        if old.exists():
            old.rename(target)
        raise
    shutil.rmtree(old, ignore_errors=True)


def read_manifest(folder: Path) -> dict[str, Any] | None:
    path = folder / MANIFEST
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None
