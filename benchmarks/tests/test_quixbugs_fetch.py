"""`agl bench data fetch quixbugs`: GitHub's zip of jkoppel/QuixBugs at the pinned commit, unpacked (the Python half
only), checked and read where it lies. GitHub cannot be reached from here: the archives are made here in its
layout (one folder `QuixBugs-<commit>/`), with two small programs, and served by `fake_hub.FakeHub`."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pytest
from fake_hub import FakeHub

from agl_bench.datasets import MANIFEST
from agl_bench.fetch import FetchError, fetch
from agl_bench.quixbugs.data import load
from agl_bench.quixbugs.evaluate import evaluate
from agl_bench.sources import QUIXBUGS_COMMIT, SOURCES, ArchiveSource

TOP = f"QuixBugs-{QUIXBUGS_COMMIT}"
LOAD_TESTDATA = """import json
from pathlib import Path


def load_json_testcases(algorithm):
    path = Path(__file__).parent / ".." / f"json_testcases/{algorithm}.json"
    with open(path) as data_file:
        return [json.loads(line) for line in data_file]
"""
TEST_ADD_ONE = """import pytest
from load_testdata import load_json_testcases

if pytest.use_correct:
    from correct_python_programs.add_one import add_one
else:
    from python_programs.add_one import add_one

testdata = load_json_testcases(add_one.__name__)


@pytest.mark.parametrize("input_data,expected", testdata)
def test_add_one(input_data, expected):
    assert add_one(*input_data) == expected
"""
TEST_HEAD = """import pytest
from node import Node

if pytest.use_correct:
    from correct_python_programs.head import head
else:
    from python_programs.head import head


def test1():
    assert head(Node(1, Node(2))) == 1


def test2():
    assert head(Node(3)) == 3
"""
NODE = "class Node:\n    def __init__(self, value=None, successor=None):\n        self.value = value\n        self.successor = successor\n"


def quixbugs_zip(*, leave_out: str = "") -> bytes:
    files = {
        "python_programs/add_one.py": 'def add_one(n):\n    return n + 2\n\n"""\nAdd one\n"""\n',
        "correct_python_programs/add_one.py": 'def add_one(n):\n    return n + 1\n\n"""\nAdd one\n"""\n',
        "python_programs/head.py": 'def head(node):\n    return node.successor\n\n"""\nFirst value\n"""\n',
        "correct_python_programs/head.py": 'def head(node):\n    return node.value\n\n"""\nFirst value\n"""\n',
        "python_programs/node.py": NODE,
        "python_testcases/node.py": NODE,
        "python_testcases/load_testdata.py": LOAD_TESTDATA,
        "python_testcases/test_add_one.py": TEST_ADD_ONE,
        "python_testcases/test_head.py": TEST_HEAD,
        "json_testcases/add_one.json": "[[1], 2]\n[[41], 42]\n[[-1], 0]\n",
        "conftest.py": "import pytest\n",
        "LICENSE": "MIT License\n",
        "java_programs/ADD_ONE.java": "class ADD_ONE {}\n",  # the Java half: not unpacked
        "README.md": "# QuixBugs\n",
    }
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for path, text in files.items():
            if path != leave_out:
                archive.writestr(f"{TOP}/{path}", text)
    return out.getvalue()


def test_the_source_is_the_pinned_commits_zip() -> None:
    origin = SOURCES["quixbugs"].origin
    assert isinstance(origin, ArchiveSource)
    assert origin.url == f"https://github.com/jkoppel/QuixBugs/archive/{QUIXBUGS_COMMIT}.zip"
    assert QUIXBUGS_COMMIT == "4257f44b0ff1181dedaedee6a447e133219fcebf" and origin.top == TOP


def test_quixbugs_is_fetched_from_its_archive_checked_and_evaluated_where_it_lies(tmp_path: Path) -> None:
    with FakeHub() as hub:
        hub.files[f"/jkoppel/QuixBugs/archive/{QUIXBUGS_COMMIT}.zip"] = (quixbugs_zip(), "application/zip")
        url = f"{hub.url}/jkoppel/QuixBugs/archive/{QUIXBUGS_COMMIT}.zip"
        folder = fetch("quixbugs", into=tmp_path / "bench", archive=url, progress=lambda _: None)
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == [
        "LICENSE",
        MANIFEST,
        "conftest.py",
        "correct_python_programs/add_one.py",
        "correct_python_programs/head.py",
        "json_testcases/add_one.json",
        "python_programs/add_one.py",
        "python_programs/head.py",
        "python_programs/node.py",
        "python_testcases/load_testdata.py",
        "python_testcases/node.py",
        "python_testcases/test_add_one.py",
        "python_testcases/test_head.py",
    ]
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["source"]["url"] == url and manifest["license"] == "MIT"
    assert sum(manifest["rows"].values()) == 2
    tasks = {t["id"]: t for t in load(tmp_path / "bench", "all")}
    assert tasks["add_one"]["description"] == "Add one" and tasks["add_one"]["cases"] == 3
    assert tasks["head"]["files"] == [
        "python_testcases/test_head.py",
        "python_testcases/node.py",
        "python_programs/node.py",
    ]
    for name, task in tasks.items():
        fixed = (folder / "correct_python_programs" / f"{name}.py").read_text()
        assert evaluate(task, fixed).reward == 1.0
        assert evaluate(task, task["source"]).reward == 0.0


@pytest.mark.parametrize(
    ("leave_out", "message"),
    [
        ("correct_python_programs/head.py", "corrected QuixBugs program head not found"),
        ("json_testcases/add_one.json", "JSON test cases of add_one not found"),
        ("python_programs/add_one.py", "QuixBugs program add_one"),
    ],
)
def test_an_incomplete_archive_is_refused_and_nothing_is_left(tmp_path: Path, leave_out: str, message: str) -> None:
    archive = tmp_path / f"{QUIXBUGS_COMMIT}.zip"
    archive.write_bytes(quixbugs_zip(leave_out=leave_out))
    with pytest.raises(FetchError, match=f"the fetched quixbugs data failed its checks: {message}"):
        fetch("quixbugs", into=tmp_path / "bench", archive=str(archive), progress=lambda _: None)
    assert list((tmp_path / "bench").iterdir()) == []
