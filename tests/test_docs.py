"""The documentation site (`make docs`): its generated reference covers every command, option, route and option-file
key from the code itself, and its strict build refuses a broken link. The hook is docs/_hooks/reference.py."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import click
import pytest

REPO = Path(__file__).resolve().parents[1]
MKDOCS = str(Path(sys.executable).with_name("mkdocs"))


def hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference", REPO / "docs" / "_hooks" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_reference_has_every_command_and_every_option() -> None:
    from agl.cli.main import cli

    reference = hook()
    text = reference.cli_reference()
    sections = dict(re.findall(r"### `(agl[^`]*)`\n(.*?)(?=\n### `|\Z)", text, re.S))
    commands = reference.walk_commands(cli)
    assert {"agl train", "agl serve", "agl worker", "agl bench train", "agl engine"} <= {p for p, _ in commands}
    assert set(sections) == {p for p, _ in commands}
    for path, command in commands:
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                for opt in param.opts:
                    assert f"`{opt}`" in sections[path], (path, opt)
    assert "`--max-staleness`" in sections["agl train"] and "`--is-cap`" in sections["agl bench train"]


def test_the_rest_reference_has_every_route_and_the_options_every_key() -> None:
    from agl_trainer.options import known_keys

    reference = hook()
    rest = reference.rest_reference()
    paths = reference.openapi_document()["paths"]
    assert len(paths) > 20
    for route, methods in paths.items():
        for method in methods:
            assert f"`{method.upper()} {route}`" in rest
    assert "`POST /api/v1/proxy/hold`" in rest
    options = reference.options_reference()
    for key in known_keys():
        assert f"| `{key}` |" in options, key


@pytest.mark.slow
def test_the_site_builds_strict_and_a_broken_link_fails_it(tmp_path: Path) -> None:
    site = tmp_path / "site"
    for name in ("mkdocs.yml", "docs", "packages"):
        if name == "packages":
            os.symlink(REPO / name, tmp_path / name)  # mkdocstrings reads the sources from here
        elif (REPO / name).is_dir():
            shutil.copytree(REPO / name, tmp_path / name)
        else:
            shutil.copy(REPO / name, tmp_path / name)
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    ok = subprocess.run(
        [MKDOCS, "build", "--strict", "--site-dir", str(site)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert "max-staleness" in (site / "reference" / "cli" / "index.html").read_text()

    page = tmp_path / "docs" / "guides" / "training.md"
    page.write_text(page.read_text() + "\nSee [the missing page](nowhere.md).\n")
    broken = subprocess.run(
        [MKDOCS, "build", "--strict", "--site-dir", str(site)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert broken.returncode != 0 and "nowhere.md" in broken.stderr, broken.stderr[-3000:]


def test_the_readme_is_a_front_page_that_links_into_the_site() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 120 and len(text.encode()) <= 10 * 1024  # a front page, not the manual
    linked = set(re.findall(r"\]\((docs/[^)#]+\.md)", text))
    assert linked and all((REPO / page).is_file() for page in linked), sorted(linked)
    pages = {str(p.relative_to(REPO)) for p in (REPO / "docs").rglob("*.md") if "_hooks" not in p.parts}
    assert pages - {"docs/index.md"} <= linked, sorted(pages - linked)  # every page is reachable from the front page


ISSUE_NUMBER = re.compile(r"\bissues? ?#?\d+|\(#\d+\)", re.IGNORECASE)


def test_no_issue_numbers_in_what_users_read_nor_in_file_names() -> None:
    """The project's history is the CHANGELOG's: the README, the docs and the package READMEs say what things are,
    and no file is named after the issue that brought it."""
    pages = [REPO / "README.md", REPO / "benchmarks" / "README.md", *(REPO / "packages").glob("*/README.md")]
    pages += [p for p in (REPO / "docs").rglob("*.md") if "_hooks" not in p.parts]
    said = {str(p.relative_to(REPO)): ISSUE_NUMBER.findall(p.read_text()) for p in pages}
    assert not {page: found for page, found in said.items() if found}
    named = []
    for folder, subfolders, files in os.walk(REPO):  # the repository's own files: environments and builds pruned
        subfolders[:] = [
            d for d in subfolders if not d.startswith((".", "node_modules", "site", "runs", "__pycache__"))
        ]
        named += [os.path.join(folder, n) for n in subfolders + files if re.search(r"issue[_-]?\d+", n, re.I)]
    assert not named
    assert ISSUE_NUMBER.search("done (issue #51)") and ISSUE_NUMBER.search("see #12") is None
