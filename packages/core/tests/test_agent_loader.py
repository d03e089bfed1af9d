"""`agl worker AGENT`: module names, plain script files and files inside package-layout projects."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agl.capture.agent_loader import AgentLoadError, load_agent, module_for_file


@pytest.fixture(autouse=True)
def _isolated_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "modules", dict(sys.modules))


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_file_inside_a_package_keeps_its_relative_imports(tmp_path: Path) -> None:
    # the layout of `crewai create crew` and most apps: src/<pkg>/main.py importing its siblings relatively
    write(tmp_path / "src/shop_bot/__init__.py", "")
    write(tmp_path / "src/shop_bot/tools.py", "def price():\n    return 42\n")
    write(tmp_path / "src/shop_bot/agents/__init__.py", "")
    main = write(
        tmp_path / "src/shop_bot/agents/main.py", "from ..tools import price\n\ndef run(task):\n    return price()\n"
    )
    assert module_for_file(main) == ("shop_bot.agents.main", tmp_path / "src")
    fn = load_agent(f"{main}:run")
    assert fn(None) == 42 and fn.__module__ == "shop_bot.agents.main"


def test_a_lone_script_is_imported_from_its_folder(tmp_path: Path) -> None:
    write(tmp_path / "helpers_for_lone.py", "X = 7\n")
    script = write(tmp_path / "lone_agent.py", "from helpers_for_lone import X\n\ndef run(task):\n    return X\n")
    assert load_agent(f"{script}:run")(None) == 7


def test_a_dotted_module_is_imported_from_the_current_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path / "dotted_pkg/__init__.py", "")
    write(tmp_path / "dotted_pkg/app.py", "def run(task):\n    return 'ok'\n")
    monkeypatch.chdir(tmp_path)
    assert load_agent("dotted_pkg.app:run")(None) == "ok"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_colon_here", "must look like"),
        ("module:", "must look like"),
        ("{missing}/gone.py:run", "does not exist"),
        ("surely_not_a_module_xyz:run", "cannot import 'surely_not_a_module_xyz' \\(looked from"),
        ("{file}:nope", "has no attribute 'nope'"),
        ("{file}:VALUE", "is a int, not a function"),
    ],
)
def test_bad_specs_say_what_is_wrong(tmp_path: Path, spec: str, message: str) -> None:
    target = write(tmp_path / "bad_spec_target.py", "VALUE = 1\n\ndef run(task):\n    return 1\n")
    with pytest.raises(AgentLoadError, match=message):
        load_agent(spec.format(missing=tmp_path, file=target))


def test_an_import_error_inside_the_agent_is_not_blamed_on_the_path(tmp_path: Path) -> None:
    script = write(tmp_path / "broken_agent.py", "import surely_missing_dependency_xyz\n")
    with pytest.raises(AgentLoadError, match="surely_missing_dependency_xyz") as info:
        load_agent(f"{script}:run")
    assert "looked from" not in str(info.value)
