"""The QuixBugs loader: the 40 programs of the shared copy, the files each one's tests need, the split, errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from agl_bench.datasets import DataError, datasets_root
from agl_bench.quixbugs.data import check, description, load, split_of
from agl_bench.quixbugs.task import TASK
from agl_bench.task import get_task


@pytest.fixture(scope="module")
def root() -> Path:
    # DataError names the folders looked in and says to run `agl bench data fetch quixbugs` when there is none
    return datasets_root(None, "quixbugs")


def test_real_programs_and_splits(root: Path) -> None:
    every = load(root, "all")
    train, test = load(root, "train"), load(root, "test")
    assert len(every) == 40 and (len(train), len(test)) == (26, 14)
    assert sorted(t["id"] for t in train + test) == [t["id"] for t in every]
    assert TASK.load(root, "test") == test and get_task("quixbugs") is TASK
    for task in every:
        assert set(task) == {"id", "program", "source", "description", "files", "cases", "data_dir"}
        assert task["description"] and task["description"] in task["source"]
        assert task["cases"] >= 3
        assert all((Path(task["data_dir"]) / f).is_file() for f in task["files"])
    assert json.loads(json.dumps(every)) == every  # travels as JSON to the workers
    by_id = {t["id"]: t for t in every}
    assert by_id["bitcount"]["files"] == [
        "python_testcases/test_bitcount.py",
        "python_testcases/load_testdata.py",
        "json_testcases/bitcount.json",
    ]
    assert by_id["bitcount"]["cases"] == 9 and by_id["bitcount"]["description"].startswith("Bitcount")
    # a graph program: the tests' Node class (and the programs' own copy), no JSON cases
    assert by_id["breadth_first_search"]["files"] == [
        "python_testcases/test_breadth_first_search.py",
        "python_testcases/node.py",
        "python_programs/node.py",
    ]
    assert by_id["shortest_paths"]["cases"] == 3 and "node.py" not in str(by_id["shortest_paths"]["files"])


def test_the_split_of_a_program_depends_on_its_name_alone(root: Path) -> None:
    names = [t["id"] for t in load(root, "test")]
    assert names == sorted(n for n in names if split_of(n) == "test")
    assert "levenshtein" in names and "minimum_spanning_tree" in names and "bitcount" not in names
    assert check(root / "quixbugs") == {"train": 26, "test": 14}


def test_description_is_the_module_string_else_the_first_docstring() -> None:
    assert description('def f(x):\n    return x\n\n"""\nIdentity\n"""\n') == "Identity"
    assert description('def f(x):\n    """Double it."""\n    return 2 * x\n') == "Double it."
    assert description("def f(x):\n    return x\n") == ""
    assert description("def f(:\n") == ""


def test_missing_or_broken_data_is_named(root: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError, match="has no quixbugs/ folder"):
        load(tmp_path, "test")
    with pytest.raises(DataError, match="unknown QuixBugs split 'dev'"):
        load(root, "dev")
    copy = tmp_path / "quixbugs"
    shutil.copytree(root / "quixbugs", copy)
    (copy / "python_programs" / "gcd.py").unlink()
    with pytest.raises(DataError, match=r"QuixBugs program gcd .*not found: .*python_programs/gcd\.py"):
        load(tmp_path, "all")
    shutil.copyfile(root / "quixbugs" / "python_programs" / "gcd.py", copy / "python_programs" / "gcd.py")
    (copy / "json_testcases" / "sqrt.json").write_text("[[2, 0.01], 1.4166666666666665]\nnot json\n")
    with pytest.raises(DataError, match=r"sqrt\.json:2: not valid JSON"):
        load(tmp_path, "all")
    (copy / "json_testcases" / "sqrt.json").unlink()
    with pytest.raises(DataError, match=r"JSON test cases of sqrt not found"):
        check(copy)
