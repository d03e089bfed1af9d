"""SWE-bench Lite and Verified from the hub's parquet files: `agl bench data fetch swebench` (Lite) against
`fake_hub.FakeHub` (the hub cannot be reached from here; the rows are made here in the official columns, the test
lists as JSON strings as the official files keep them), the Verified source fetched the same way, the loader's
splits and task inputs, and its errors naming the file and what is missing."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fake_hub import FakeHub, Repo

from agl_bench.datasets import MANIFEST, DataError
from agl_bench.sources import SOURCES, HubSource
from agl_bench.swebench.data import load

AGL = [sys.executable, "-m", "agl.cli.main"]


def instance(iid: str, repo: str = "astropy/astropy", **extra: Any) -> dict[str, Any]:
    return {
        "repo": repo,
        "instance_id": iid,
        "base_commit": "d16bfe05a744909de4b27f5875fe0d4ed41ce607",
        "patch": "diff --git a/gold.py b/gold.py\n",
        "test_patch": "diff --git a/test_gold.py b/test_gold.py\n",
        "problem_statement": f"Issue of {iid}",
        "hints_text": "",
        "created_at": "2022-03-03T15:14:54Z",
        "version": "4.3",
        "FAIL_TO_PASS": json.dumps([f"tests/test_{iid}.py::test_new"]),
        "PASS_TO_PASS": json.dumps(["tests/test_a.py::test_old"]),
        "environment_setup_commit": "298ccb478e6bf092953bca67a3d29dc6c35f6752",
        **extra,
    }


def parquet(rows: list[dict[str, Any]]) -> bytes:
    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), out)
    return out.getvalue()


def lite_repo() -> Repo:
    return Repo(
        {
            "README.md": b"---\nlicense: mit\n---\n# SWE-bench Lite\n",
            "data/dev-00000-of-00001.parquet": parquet([instance("sqlfluff__sqlfluff-1625", "sqlfluff/sqlfluff")]),
            "data/test-00000-of-00001.parquet": parquet([instance("astropy__astropy-12907"), instance("a__b-2")]),
        }
    )


def env_for(tmp_path: Path, hub: FakeHub) -> dict[str, str]:
    return {
        **os.environ,
        "AGL_BENCH_DATA": str(tmp_path / "bench"),
        "AGL_CACHE_DIR": str(tmp_path / "agl-cache"),
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_ENDPOINT": hub.url,
    }


def test_lite_and_verified_are_fetched_from_the_hub_and_loaded_by_split(tmp_path: Path) -> None:
    lite, verified = SOURCES["swebench"].origin, SOURCES["swebench_verified"].origin
    assert isinstance(lite, HubSource) and lite.repo_id == "princeton-nlp/SWE-bench_Lite"
    assert isinstance(verified, HubSource) and verified.repo_id == "princeton-nlp/SWE-bench_Verified"
    with FakeHub() as hub:
        hub.repos[lite.repo_id] = lite_repo()
        hub.repos[verified.repo_id] = Repo({"data/test-00000-of-00001.parquet": parquet([instance("django__d-1")])})
        env = env_for(tmp_path, hub)
        done = subprocess.run([*AGL, "bench", "data", "fetch", "swebench"], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        # Verified is a source of its own, beside the task's: `agl bench data fetch` names sources
        done = subprocess.run(
            [*AGL, "bench", "data", "fetch", "swebench_verified"], env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
    root = tmp_path / "bench"
    assert json.loads((root / "swebench" / MANIFEST).read_text())["rows"] == {"lite-dev": 1, "lite-test": 2}
    assert json.loads((root / "swebench_verified" / MANIFEST).read_text())["rows"] == {"verified-test": 1}

    test = load(root, "lite-test")
    assert [t["id"] for t in test] == ["astropy__astropy-12907", "a__b-2"]
    shard = root / "swebench" / "data" / "test-00000-of-00001.parquet"
    assert test[0] == {
        "id": "astropy__astropy-12907",
        "instance_id": "astropy__astropy-12907",
        "repo": "astropy/astropy",
        "base_commit": "d16bfe05a744909de4b27f5875fe0d4ed41ce607",
        "problem_statement": "Issue of astropy__astropy-12907",
        "FAIL_TO_PASS": ["tests/test_astropy__astropy-12907.py::test_new"],  # decoded from the JSON string
        "PASS_TO_PASS": ["tests/test_a.py::test_old"],
        "version": "4.3",
        "environment_setup_commit": "298ccb478e6bf092953bca67a3d29dc6c35f6752",
        "hints_text": "",
        "dataset": "princeton-nlp/SWE-bench_Lite",
        "split": "test",
        "dataset_file": str(shard),  # what the official harness is given: the very rows the agent saw
    }
    assert "patch" not in test[0] and "test_patch" not in test[0]  # the gold answer stays out of the agent's input
    assert [t["id"] for t in load(root, "lite-dev")] == ["sqlfluff__sqlfluff-1625"]
    (only,) = load(root, "verified-test")
    assert only["dataset"] == "princeton-nlp/SWE-bench_Verified" and only["repo"] == "astropy/astropy"


def test_a_folder_laid_out_as_the_swebench_package_writes_it_loads_too(tmp_path: Path) -> None:
    (tmp_path / "swebench").mkdir()
    (tmp_path / "swebench" / "test.parquet").write_bytes(parquet([instance("x__y-1", FAIL_TO_PASS=["t::a"])]))
    (task,) = load(tmp_path, "lite-test")
    assert task["FAIL_TO_PASS"] == ["t::a"]  # a list column is read as it is


def test_the_loaders_errors_name_the_file_and_what_is_missing(tmp_path: Path) -> None:
    folder = tmp_path / "swebench" / "data"
    folder.mkdir(parents=True)
    with pytest.raises(DataError, match="unknown SWE-bench split 'full-test'; choose one of lite-test, lite-dev"):
        load(tmp_path, "full-test")
    with pytest.raises(DataError, match=r"lite-test split not found: no .*swebench/data/test-\*\.parquet"):
        load(tmp_path, "lite-test")
    with pytest.raises(DataError, match=r"verified-test not found: no .*swebench_verified"):
        load(tmp_path, "verified-test")

    shard = folder / "test-00000-of-00001.parquet"
    row = instance("a__b-1")
    del row["base_commit"], row["version"]
    shard.write_bytes(parquet([row]))
    with pytest.raises(DataError, match=f"{shard}: missing column\\(s\\) base_commit, version"):
        load(tmp_path, "lite-test")
    shard.write_bytes(parquet([instance("a__b-1"), instance("a__b-2", FAIL_TO_PASS="[not json")]))
    with pytest.raises(DataError, match=r"row 2 \(a__b-2\): field FAIL_TO_PASS is not a JSON list"):
        load(tmp_path, "lite-test")
    shard.write_bytes(parquet([instance("a__b-1", FAIL_TO_PASS="[]")]))
    with pytest.raises(DataError, match=r"row 1 \(a__b-1\): FAIL_TO_PASS is empty"):
        load(tmp_path, "lite-test")
    shard.write_bytes(parquet([instance("a__b-1", problem_statement=" ")]))
    with pytest.raises(DataError, match=r"row 1 .*field problem_statement must be a non-empty string"):
        load(tmp_path, "lite-test")
    shard.write_bytes(b"not parquet")
    with pytest.raises(DataError, match=f"{shard}: not a readable parquet file"):
        load(tmp_path, "lite-test")
