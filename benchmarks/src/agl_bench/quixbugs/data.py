"""QuixBugs (its Python half) as agent task inputs: one defective program each, with its description and tests.

Files read from `<datasets root>/quixbugs/`, as the repository jkoppel/QuixBugs lays them out:
`python_programs/NAME.py` (the program with its one-line defect), `correct_python_programs/NAME.py` (the fix,
used only to check the data), `python_testcases/test_NAME.py` (the repository's pytest tests; a test that reads
`load_json_testcases` takes its input/expected pairs from `json_testcases/NAME.json`), and the helpers the tests
import (`python_testcases/node.py`, `python_testcases/load_testdata.py`). A program is every `test_NAME.py` with
its `python_programs/NAME.py`: 40 at the pinned commit. The `python_programs/*_test.py` scripts are the graph
programs' own demo drivers (they print, they assert nothing): the pytest tests replace them, so they are not used.

Splits: `test` holds the programs whose name hashes (sha256 of `quixbugs-split:NAME`) into the first 25 % of the
range, `train` the others, `all` every program. The rule reads each name alone, so the split of a program never
changes when programs are added (a seeded shuffle of the list would reshuffle them all); at the pinned commit
it gives 14 test and 26 train programs, graph and list programs on both sides.

A task input is `{id, program, source, description, files, cases, data_dir}`: `source` the defective program,
`description` its docstring (each program carries its specification as a string after the code), `files` the
paths (under `data_dir`, absolute) that its tests need besides the program itself, `cases` how many test cases
its tests hold. `evaluate.evaluate` copies those files and the repaired program into a fresh folder to run them.
"""

from __future__ import annotations

import ast
import hashlib
import json
from pathlib import Path
from typing import Any

from agl_bench.datasets import DataError, require_file, task_folder

TASK_DIR = "quixbugs"
SPLITS = ("train", "test", "all")
PROGRAMS = "python_programs"
CORRECT = "correct_python_programs"
TESTS = "python_testcases"
JSON_CASES = "json_testcases"
TEST_PERCENT = 25
# Beside the tests' own `node.py`, the graph programs' folder has one too: copied with it so that a repaired
# program may import it as the repository's other Python files do (`from .node import Node`).
PROGRAM_HELPERS = ("node.py",)


def split_of(name: str) -> str:
    digest = hashlib.sha256(f"quixbugs-split:{name}".encode()).digest()
    return "test" if int.from_bytes(digest[:4], "big") % 100 < TEST_PERCENT else "train"


def program_names(folder: Path) -> list[str]:
    """Every program that has both a test file and a defective version, sorted."""
    tests = folder / TESTS
    if not tests.is_dir():
        raise DataError(f"QuixBugs tests not found: {tests} (is {folder} a copy of jkoppel/QuixBugs?)")
    names = sorted(p.stem.removeprefix("test_") for p in tests.glob("test_*.py"))
    if not names:
        raise DataError(f"{tests} holds no test_*.py file")
    for name in names:
        require_file(folder / PROGRAMS / f"{name}.py", f"QuixBugs program {name} (its test is {tests}/test_{name}.py)")
    return names


def description(source: str) -> str:
    """A program's specification: its module-level string (QuixBugs puts it after the code), else the docstring
    of its first function, else ""."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ""
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return node.value.value.strip()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            return (ast.get_docstring(node) or "").strip()
    return ""


def _imported_modules(tree: ast.Module) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.add(node.module.split(".")[0])
    return modules


def _read_tree(path: Path) -> ast.Module:
    text = require_file(path, "QuixBugs file").read_text(encoding="utf-8")
    try:
        return ast.parse(text, filename=str(path))
    except SyntaxError as exc:
        raise DataError(f"{path}:{exc.lineno}: not valid Python ({exc.msg})") from None


def test_files(folder: Path, name: str) -> list[str]:
    """The paths (relative to `folder`) that the tests of `name` need besides the program: its test file, the
    helper modules of `python_testcases/` it imports, its JSON cases, and for graph programs `PROGRAM_HELPERS`."""
    test = f"{TESTS}/test_{name}.py"
    modules = _imported_modules(_read_tree(folder / test))
    helpers = sorted(f"{TESTS}/{m}.py" for m in modules if (folder / TESTS / f"{m}.py").is_file())
    files = [test, *helpers]
    if "load_testdata" in modules:
        files.append(
            require_file(folder / JSON_CASES / f"{name}.json", f"JSON test cases of {name}")
            .relative_to(folder)
            .as_posix()
        )
    if "node" in modules:
        files += [f"{PROGRAMS}/{h}" for h in PROGRAM_HELPERS if (folder / PROGRAMS / h).is_file()]
    return files


def count_cases(folder: Path, name: str, files: list[str]) -> int:
    """How many test cases the tests of `name` hold: its JSON lines (each checked to be an `[input, expected]`
    pair), else its test functions."""
    json_file = next((f for f in files if f.startswith(f"{JSON_CASES}/")), None)
    if json_file is None:
        tree = _read_tree(folder / f"{TESTS}/test_{name}.py")
        return sum(1 for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test"))
    path = folder / json_file
    count = 0
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
        if not (isinstance(row, list) and len(row) == 2):
            raise DataError(f"{path}:{lineno}: expected an [input, expected] pair")
        count += 1
    return count


def task_input(folder: Path, name: str) -> dict[str, Any]:
    source = (folder / PROGRAMS / f"{name}.py").read_text(encoding="utf-8")
    files = test_files(folder, name)
    return {
        "id": name,
        "program": name,
        "source": source,
        "description": description(source),
        "files": files,
        "cases": count_cases(folder, name, files),
        "data_dir": str(folder.resolve()),
    }


def load(root: Path, split: str) -> list[dict[str, Any]]:
    """The task inputs of one split, by program name."""
    if split not in SPLITS:
        raise DataError(f"unknown QuixBugs split {split!r}; choose one of {', '.join(SPLITS)}")
    folder = task_folder(root, TASK_DIR)
    names = program_names(folder)
    return [task_input(folder, name) for name in names if split == "all" or split_of(name) == split]


def check(folder: Path) -> dict[str, int]:
    """Programs per split in `folder` (a fetched `quixbugs/`): every program has its fixed version, its tests
    parse, their helpers and JSON cases are there."""
    names = program_names(folder)
    for name in names:
        require_file(folder / CORRECT / f"{name}.py", f"corrected QuixBugs program {name}")
        files = test_files(folder, name)
        for path in files:
            require_file(folder / path, f"file the tests of {name} need")
        if count_cases(folder, name, files) < 1:
            raise DataError(f"the tests of {name} hold no test case")
    require_file(folder / TESTS / "load_testdata.py", "QuixBugs test helper")
    counts = {"train": 0, "test": 0}
    for name in names:
        counts[split_of(name)] += 1
    return counts
